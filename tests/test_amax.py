"""The tensor amax kernel: offline compile checks (CI) and exactness on the GPU."""
import pytest
import torch


@pytest.mark.compile
def test_amax_compiles_for_sm90a_with_vector_loads_and_no_spills():
    from kernels.nvfp4 import amax as mod
    from workbench.compile import compile_report

    r = compile_report(mod.TensorAbsMax(), *mod.compile_args(), arch="sm_90a")
    assert ".target sm_90a" in r.ptx
    assert r.census["ld.global.v4"] >= 1, "16-byte loads expected"
    assert r.census["atom"] >= 1
    assert r.spill_bytes == 0
    assert 0 < r.registers <= 64


@pytest.mark.compile
def test_amax_compiles_for_sm120a():
    from kernels.nvfp4 import amax as mod
    from workbench.compile import compile_report

    r = compile_report(mod.TensorAbsMax(), *mod.compile_args(), arch="sm_120a")
    assert ".target sm_120a" in r.ptx and r.registers > 0


def _same(a, b):
    return (torch.isnan(a) and torch.isnan(b)) or bool(a == b)


@pytest.mark.gpu
@pytest.mark.fast
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1000, 4096 * 33 + 5, 37810 * 5376])
def test_amax_matches_torch(dtype, n):
    from kernels.nvfp4.amax import amax

    g = torch.Generator(device="cuda").manual_seed(n)
    x = torch.randn(n, device="cuda", generator=g).to(dtype) * 3
    assert _same(amax(x), torch.amax(x.abs()))
    # the maximum placed at the very end, the very start, negative
    x[-1] = -1e4 if dtype == torch.bfloat16 else -6e4
    assert _same(amax(x), torch.amax(x.abs()))
    x[0] = float("inf")
    assert _same(amax(x), torch.amax(x.abs()))
    x[n // 2] = float("nan")
    assert torch.isnan(amax(x))


@pytest.mark.gpu
def test_amax_rejects_bad_input_before_launch():
    from kernels.nvfp4.amax import amax

    with pytest.raises(TypeError):
        amax(torch.ones(16, device="cuda"))
    with pytest.raises(ValueError):
        amax(torch.ones(16, dtype=torch.bfloat16))
    with pytest.raises(ValueError):
        amax(torch.ones(32, dtype=torch.bfloat16, device="cuda")[1:])
    with pytest.raises(ValueError):
        amax(torch.ones(8, 8, dtype=torch.bfloat16, device="cuda").t())
