"""The fast loop's bits under timing stress (notes/fast-loop.md v14a; scripts/stress_fast_loop.py):
where two frames differ and the harness's accounting of it (CPU), the timing-perturbation
debug build and the attention step's read of cache slot 0 after its wait (compile), and every
bucket's default frames beside a busy stream and in the perturbed build (H200)."""
import functools
import json
import re
from pathlib import Path

import pytest
import torch

from configs.codepredictor import QWEN3_TTS_1P7B, CodePredictorConfig
from models.codepredictor import random_weights
from models.fast_loop import FastLoop, FastWeights, frame_difference
from schedules.plan import BUCKETS
from scripts.stress_fast_loop import (BusyStream, Case, reference, snapshot, stress_frames)

REPO = Path(__file__).resolve().parents[1]
TINY = CodePredictorConfig(hidden=64, intermediate=128, layers=2, q_heads=4, kv_heads=2,
                           head_dim=16, talker_hidden=48, vocab=32)
# the kernels the fast loop chains by PDL: each goes through device.ptx's wrappers, and each
# compile-cache key names the perturbation
PDL_KERNELS = ("gemv_small_m", "attention", "draw", "rows_rmsnorm", "gemm_skinny",
               "gemm_skinny_rwgmma", "gemm_skinny_wgmma")


def _tiny_loop():
    loop = FastLoop(FastWeights(random_weights(TINY, seed=4, dtype=torch.float32)), 3)
    g = torch.Generator().manual_seed(7)
    inputs = [(torch.randn(3, TINY.talker_hidden, generator=g),
               torch.randint(0, TINY.vocab, (3,), generator=g)) for _ in range(2)]
    return loop, inputs


def test_frame_difference_names_the_earliest_differing_point():
    loop, inputs = _tiny_loop()
    a = snapshot(loop(*inputs[0]))
    b = snapshot(a)
    assert frame_difference(a, b) is None
    a.logits[0, 0, 0], b.logits[0, 0, 0] = float("nan"), float("nan")  # the same bits
    assert frame_difference(a, b) is None
    b.kv[1][1][2, 1, 3, 5] += 1  # layer 1's V at position 3
    b.logits[1, 1, 7] = -b.logits[1, 1, 7]  # group 1: computed at position 2
    d = frame_difference(a, b)
    assert d["first"] == "logits group 1" and d["first_position"] == 2
    assert d["kv"] == [(1, "v", 3)] and d["logits"] == [1] and not d["talker_sum"]
    b.kv[0][0][0, 0, 2, 0] += 1  # position 2's K append comes before its logits
    assert frame_difference(a, b)["first"] == "kv layer 0 k position 2"
    a.talker_sum[0, 0], b.talker_sum[0, 0] = 0.0, -0.0  # signed zeros differ in bits
    assert frame_difference(a, b)["talker_sum"]


class _Flaky:
    """A loop whose frames ``bad`` come out with one K element of layer 1, position 1 changed
    (in the loop's own buffers, which the next frame rewrites)."""

    def __init__(self, loop, bad):
        self.loop, self.sampler, self.bad, self.calls = loop, None, bad, 0

    def __call__(self, *args):
        out = self.loop(*args)
        if self.calls in self.bad:
            out.kv[1][0][0, 0, 1, 0] += 1
        self.calls += 1
        return out


def test_stress_frames_counts_and_locates_each_differing_frame():
    loop, inputs = _tiny_loop()
    refs = [reference(loop, x)[0] for x in inputs]
    assert [reference(loop, x)[1] for x in inputs] == [None, None]
    res = stress_frames(_Flaky(loop, {5, 8}), inputs, refs, 12, batch=4)
    assert res["frames"] == 12 and res["differing"] == 2
    assert [(f["frame"], f["input"]) for f in res["differing_frames"]] == [(5, 1), (8, 0)]
    assert res["first"]["first"] == "kv layer 1 k position 1"
    assert res["first_at"] == {"kv layer 1 k position 1": 2}
    assert res["fingerprints"]["reference"] != res["fingerprints"]["got"]
    assert stress_frames(loop, inputs, refs, 5, batch=4)["differing"] == 0


# ---- compile tests (CPU) --------------------------------------------------------------------
def _ptx(build, perturb, monkeypatch):
    from kernels.depth.attention import DepthAttention, compile_args
    from kernels.depth.rows_rmsnorm import RowsRmsNorm
    from kernels.depth.rows_rmsnorm import compile_args as norm_args
    from workbench.compile import compile_report

    if perturb is None:
        monkeypatch.delenv("WB_PERTURB_TIMING", raising=False)
    else:
        monkeypatch.setenv("WB_PERTURB_TIMING", perturb)
    kernel, args = {"attention": (lambda: DepthAttention(8, 16, 8), lambda: compile_args(8)),
                    "attention_no_pdl": (lambda: DepthAttention(8, 16, 8, pdl=False),
                                         lambda: compile_args(8)),
                    "norm": (lambda: RowsRmsNorm(16, 1024, pdl=True), norm_args)}[build]
    return compile_report(kernel(), *args()).ptx


@pytest.mark.compile
@pytest.mark.parametrize("build", ["attention", "norm"])
def test_timing_perturbation_is_a_debug_build_apart(build, monkeypatch):
    """WB_PERTURB_TIMING (device.ptx) puts a nanosleep after the PDL wait and before and after
    the trigger; the default build has none and is the same PTX as with the variable "0"."""
    default = _ptx(build, None, monkeypatch)
    assert "nanosleep" not in default and default == _ptx(build, "0", monkeypatch)
    perturbed = _ptx(build, "1", monkeypatch)
    for ptx in (default, perturbed):
        assert ptx.count("griddepcontrol.wait") == 1
        assert ptx.count("griddepcontrol.launch_dependents") == 1
    assert perturbed.count("nanosleep.u32") == 3
    # nothing to perturb without PDL
    assert "nanosleep" not in _ptx("attention_no_pdl", "1", monkeypatch)


@pytest.mark.compile
def test_attention_reads_cache_slot_0_only_after_its_wait(monkeypatch):
    """Before griddepcontrol.wait the attention step loads its four tables' elements and the
    cache slots 1-15 of K and V, not slot 0 (position 0's stream writes it: v14a; the old order
    loaded 4 + 2 x 16, and differed in up to 210 of 300 perturbed frames)"""
    from kernels.depth.attention import SLOTS, DepthAttention, compile_args
    from workbench.compile import compile_report

    monkeypatch.delenv("WB_PERTURB_TIMING", raising=False)

    ptx = compile_report(DepthAttention(8, 16, 8), *compile_args(8)).ptx
    loads_before_wait = len(re.findall(r"\bld\.global", ptx.split("griddepcontrol.wait")[0]))
    assert loads_before_wait == 4 + 2 * (SLOTS - 1)


def test_pdl_kernels_go_through_the_wrappers_and_key_the_perturbation():
    for name in PDL_KERNELS:
        src = (REPO / "kernels" / "depth" / f"{name}.py").read_text()
        code = "\n".join(ln for ln in src.splitlines()
                         if not ln.lstrip().startswith(("from ", "import ")))
        assert "griddepcontrol_" not in code and "pdl_wait()" in code, name
        assert code.count("timing_perturbation()") == code.count("cached_compile(") >= 1, name


# ---- on the H200 ----------------------------------------------------------------------------
STRESS_FRAMES = 50


@functools.lru_cache(maxsize=1)
def _weights():
    return FastWeights(random_weights(QWEN3_TTS_1P7B, seed=0, dtype=torch.bfloat16)
                       .to(device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", BUCKETS)
def test_frames_keep_their_bits_beside_a_busy_stream_and_perturbed_on_h200(rows, tmp_path):
    """The bucket's default sampled frame, two input sets in turn (each frame after one of the
    other inputs), STRESS_FRAMES times beside a busy stream and STRESS_FRAMES times in the
    timing-perturbation build: every frame has its reference's bits (the third of three frames
    of its inputs in a row), and so do the first frames after the build and after the other
    inputs. A failure names where the first differing frame differs, with both fingerprints
    (also in a file under tmp_path)."""
    case = Case(_weights(), rows, "sampled")
    runs = {"first frames": {"differing": sum(d is not None for d in case.warmup_differences),
                             "frames": 2, "first": case.warmup_differences}}
    runs["busy"] = stress_frames(case.loop, case.inputs, case.refs, STRESS_FRAMES,
                                 before_frame=BusyStream())
    runs["perturbed"] = stress_frames(case.loop_for({"perturbed"}, 2000), case.inputs,
                                      case.refs, STRESS_FRAMES)
    bad = {name: r for name, r in runs.items() if r["differing"]}
    if bad:
        record = tmp_path / f"stress-{rows}.json"
        record.write_text(json.dumps(bad, indent=1, default=str))
        pytest.fail(f"{rows} rows: frames differ ({record}): {json.dumps(bad, default=str)}")
    assert runs["busy"]["frames"] == runs["perturbed"]["frames"] == STRESS_FRAMES
