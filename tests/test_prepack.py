"""kernels/nvfp4/prepack.py: the register-order weight prepack, against an independent
construction of wgmma's register-A fragment layout (CuTe's ALayout_64x16 strides)."""
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.nvfp4 import prepack as P
from numerics import nvfp4
from numerics.formats import e2m1_decode, e4m3_decode


def _operand(N: int, K: int, seed: int):
    """Fresh random Comfy-packed codes [N, K/2] and finite scale bytes, swizzled, zero padded."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (N, K // 2), generator=gen, dtype=torch.uint8)
    s = torch.randint(0, 0x7F, (N, K // 16), generator=gen, dtype=torch.uint8)
    return q, nvfp4.to_blocked(s).view(torch.float8_e4m3fn)


def _cute_a_layout():
    """(m, k) of value v of thread t in wgmma's 64x16 register-A tile, from CuTe's
    ALayout_64x16 = ((4, 8, 4), (2, 2, 2)) : ((128, 1, 16), (64, 8, 512)) over the column-major
    (m + 64·k) index; register j holds values 2j (low half) and 2j + 1."""
    t = torch.arange(128).view(-1, 1)
    v = torch.arange(8).view(1, -1)
    idx = (128 * (t % 4) + (t // 4) % 8 + 16 * (t // 32)
           + 64 * (v % 2) + 8 * ((v // 2) % 2) + 512 * (v // 4))
    return idx % 64, idx // 64  # [128, 8] each


@given(N=st.integers(1, 300), kb=st.integers(1, 24), seed=st.integers(0, 2**30))
def test_unpack_inverts_prepack(N, kb, seed):
    q, s = _operand(N, 16 * kb, seed)
    p = P.prepack(q, s)
    q2, s2 = P.unpack(p)
    assert torch.equal(q2, q)
    assert torch.equal(s2.view(torch.uint8), s.view(torch.uint8))


def test_unpack_inverts_prepack_on_reference_quantized_weights():
    w = torch.randn(80, 96, generator=torch.Generator().manual_seed(3)).bfloat16()
    weight = P.Nvfp4Weight.quantize(w)
    q, s = nvfp4.quantize(w, nvfp4.global_scale(w))
    assert torch.equal(weight.packed, q) and torch.equal(weight.scales.view(torch.uint8),
                                                        s.view(torch.uint8))
    assert weight.g == float(nvfp4.global_scale(w))
    q2, s2 = P.unpack(weight.prepacked)
    assert torch.equal(q2, q) and torch.equal(s2.view(torch.uint8), s.view(torch.uint8))


@given(N=st.integers(1, 200), kb=st.integers(1, 12), seed=st.integers(0, 2**30))
def test_each_128_bit_load_is_four_k16_steps_of_fragments_in_register_order(N, kb, seed):
    """Thread t's 16 bytes of (slab, k-block) are, word by word, the A fragments of the 4
    consecutive k16 steps; byte j of a word is register j: the element pair (v = 2j, 2j + 1)
    of CuTe's layout, first element in the high nibble as Comfy packs it. Past N and K: 0."""
    K = 16 * kb
    q, s = _operand(N, K, seed)
    p = P.prepack(q, s)
    n_slabs, n_kb = p.codes.shape[:2]
    assert p.codes.shape == (n_slabs, n_kb, 128, 16) and n_slabs == -(-N // 64)
    codes = torch.zeros(n_slabs * 64, n_kb * 64, dtype=torch.uint8)
    codes[:N, :K] = nvfp4.unpack_codes(q)
    m, k = _cute_a_layout()
    words = p.codes.view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # little-endian 32-bit words
    assert words.shape == (n_slabs, n_kb, 128, 4)
    for slab in range(n_slabs):
        for b in range(n_kb):
            for step in range(4):
                rows, ks = 64 * slab + m, 64 * b + 16 * step + k  # [128, 8]
                vals = codes[rows, ks]
                want = (vals[:, 0::2].to(torch.int64) << 4) | vals[:, 1::2]  # [128, 4] bytes
                got = torch.stack([(words[slab, b, :, step] >> (8 * j)) & 0xFF
                                   for j in range(4)], dim=1)
                assert torch.equal(got, want), (slab, b, step)


@given(N=st.integers(1, 200), kb=st.integers(1, 12), seed=st.integers(0, 2**30))
def test_each_thread_finds_the_scale_of_every_fragment_element(N, kb, seed):
    """For every element of thread t's register j at step s, its block scale (row, k // 16)
    is byte 2·s + (j % 2) of the thread's group t // 4: fragment values times prepacked scales
    equal the reference's dequantized operand (e2m1·s, exact) at CuTe's coordinates."""
    K = 16 * kb
    q, s = _operand(N, K, seed)
    p = P.prepack(q, s)
    n_slabs, n_kb = p.codes.shape[:2]
    assert p.scales.shape == (n_slabs, n_kb, 32, 8)
    ref = torch.zeros(n_slabs * 64, n_kb * 64, dtype=torch.float64)
    ref[:N, :K] = nvfp4.dequantize_operand(q, s, (N, K)).double()
    m, k = _cute_a_layout()
    v = torch.arange(8)
    for slab in range(n_slabs):
        for b in range(n_kb):
            for step in range(4):
                byte = p.codes[slab, b, :, 4 * step + v // 2]  # [128, 8]: register v // 2
                code = torch.where(v % 2 == 0, byte >> 4, byte & 0xF)
                sc = p.scales[slab, b, torch.arange(128).view(-1, 1) // 4, 2 * step + (v // 2) % 2]
                got = e2m1_decode(code, torch.float64) * e4m3_decode(sc).double()
                want = ref[64 * slab + m, 64 * b + 16 * step + k]
                assert torch.equal(got, want), (slab, b, step)


def test_fragment_coords_is_the_ptx_isa_description():
    """Spot values from the PTX ISA figure (wgmma .m64nNk16 A, f16): T0 holds rows 0 / 8 at
    k 0-1 / 8-9; T5 (group 1, tig 1) row 1 at k 2-3; T127 (warp 3) rows 63 / 55 at k 14-15."""
    assert [P.fragment_coords(0, j) for j in range(4)] == [(0, 0), (8, 0), (0, 8), (8, 8)]
    assert P.fragment_coords(5, 0) == (1, 2)
    assert P.fragment_coords(127, 3) == (63, 14) and P.fragment_coords(127, 2) == (55, 14)


def test_prepack_rejects_bad_input_before_any_work():
    q, s = _operand(64, 64, 0)
    with pytest.raises(TypeError, match="packed"):
        P.prepack(q.to(torch.int16), s)
    with pytest.raises(TypeError, match="packed"):
        P.prepack(q.numpy(), s)
    with pytest.raises(ValueError, match="packed"):
        P.prepack(q[0], s)
    with pytest.raises(TypeError, match="scales"):
        P.prepack(q, s.view(torch.uint8).to(torch.int32))
    with pytest.raises(ValueError, match="swizzled shape"):
        P.prepack(q, s[:, :2])
    with pytest.raises(ValueError, match="multiple of 16"):
        P.prepack(q[:, :4], nvfp4.to_blocked(torch.zeros(64, 1, dtype=torch.uint8)))
    with pytest.raises(TypeError, match="PrepackedWeights"):
        P.unpack((q, s))
    with pytest.raises(TypeError, match="g must be"):
        P.Nvfp4Weight.from_packed(q, s, "1.0")
    with pytest.raises(ValueError, match="g = -1.0"):
        P.Nvfp4Weight.from_packed(q, s, -1.0)
    with pytest.raises(TypeError, match="x has dtype"):
        P.Nvfp4Weight.quantize(torch.randn(32, 32, dtype=torch.float64))


def test_prepack_module_imports_no_cutlass():
    code = "import sys, kernels.nvfp4.prepack; sys.exit('cutlass' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
