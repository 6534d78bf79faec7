"""P2's bounded ring (kernels/nvfp4/ring.py, schedules/p2_ring.py, Nvfp4Linear's p2 backend).

CPU: the chunk plan, the ring's bytes, the checks made before any launch, and the ring's launch
sequence with the kernels replaced by the exact references (numerics.nvfp4.quantize writing
only the chunk's rows, as the ``_into`` kernel does; the exact oracle for the GEMM), so the
row offsets, the output slices, the partial last chunk and the one tensor scale are checked
bit for bit against the whole reference call without a GPU.
GPU (marked ``gpu``): every chunk bit-identical to P0's whole call, two overlapping requests on
two streams, poisoned outputs, Nvfp4Linear p2 against p0.
"""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from models.nvfp4_linear import BackendUnavailable, Nvfp4Linear, resolve_backend
from numerics import gemm_oracle as G
from numerics import nvfp4
from numerics.epilogue import gate_residual
from schedules import p2_ring as P
from workbench import WorkbenchError

HAVE_CUDA = torch.cuda.is_available()
HOPPER = HAVE_CUDA and torch.cuda.get_device_capability(0) == (9, 0)


# --- the plan (schedules/p2_ring.py) ------------------------------------------------------
@given(t0=st.integers(0, 40), length=st.integers(1, 20000), cap_tiles=st.integers(1, 40))
def test_chunk_plan_covers_rows_in_order_on_scale_tiles(t0, length, cap_tiles):
    r0, cap = 128 * t0, 128 * cap_tiles
    r1 = r0 + length
    chunks = P.chunk_plan(r0, r1, cap)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert chunks[0].start == r0 and chunks[-1].stop == r1
    assert all(a.stop == b.start for a, b in zip(chunks, chunks[1:]))
    assert all(c.start % 128 == 0 and 0 < c.rows <= cap for c in chunks)
    assert all(c.rows == cap for c in chunks[:-1])  # only the last may be partial
    assert len(chunks) == -(-length // cap)


def test_chunk_plan_h3_rows():
    """37,810 rows at 2048: 18 full chunks and a 946-row last one (the seed's 19 chunks)."""
    chunks = P.chunk_plan(0, 37810, 2048)
    assert len(chunks) == 19 and chunks[-1].rows == 946
    assert [len(P.chunk_plan(0, 37810, c)) for c in P.CAPACITIES] == [296, 74, 37, 19, 10]


@pytest.mark.parametrize("cap, err", [(0, ValueError), (100, ValueError), (-128, ValueError),
                                      (128.0, TypeError), (True, TypeError), ("2048", TypeError)])
def test_capacity_refused(cap, err):
    with pytest.raises(err, match="capacity"):
        P.check_capacity(cap)


def test_chunk_plan_refusals():
    with pytest.raises(ValueError, match="multiple of 128"):
        P.chunk_plan(64, 1000, 512)
    with pytest.raises(ValueError, match="0 <= r0 < r1"):
        P.chunk_plan(128, 128, 512)
    with pytest.raises(TypeError, match="rows must be ints"):
        P.chunk_plan(0, 10.0, 512)


def test_ring_bytes():
    # K = 5376: 2688 code bytes + 336 scale bytes a row (the notes' 6.19 MB at 2048 rows)
    assert P.ring_bytes(2048, 5376) == 2048 * (2688 + 336) == 6_193_152
    assert P.ring_bytes(128, 96) == 128 * (48 + 8)  # K/16 = 6 scale columns padded to 8
    with pytest.raises(ValueError, match="multiple of 16"):
        P.ring_bytes(128, 40)


def test_rounds_model_of_the_prediction():
    """notes/p2.md's round counts (132 SMs, 128 x 256 tiles) come from these functions."""
    whole = {"qkv": 189, "out": 48, "fc1": 126}
    n_tiles = {"qkv": 84, "out": 21, "fc1": 56}
    chunked = {"qkv": [296, 222, 222, 204, 195], "out": [296, 74, 74, 56, 56],
               "fc1": [296, 148, 148, 130, 130]}
    for name, nt in n_tiles.items():
        assert P.rounds(37810, nt, 132) == whole[name]
        assert [P.chunked_rounds(0, 37810, c, nt, 132) for c in P.CAPACITIES] == chunked[name]


# --- the ring's checks and launch sequence, kernels replaced by the references ------------
def _operands(M, N, K, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, K, generator=gen) * torch.exp(torch.randn(K, generator=gen))).to(
        torch.bfloat16)
    w = (torch.randn(N, K, generator=gen) / K**0.5).to(torch.bfloat16)
    g_w = nvfp4.global_scale(w)
    w_q, w_s = nvfp4.quantize(w, g_w)
    return x, w_q, w_s, float(g_w)


class _Fakes:
    """The ring module with its device parts replaced: the references as kernels, a named
    stream, the launches recorded."""

    def __init__(self, R, monkeypatch):
        self.calls, self.stream = [], "stream-0"
        for name in ("require_hopper", "check_cuda_tensor", "validate_gemm"):
            monkeypatch.setattr(R, name, lambda *a, **k: None)
        monkeypatch.setattr(R, "launch_config", lambda config, *a, **k: config)
        monkeypatch.setattr(R, "default_config", lambda m, N, K, stream_k=True: ("whole", m))
        monkeypatch.setattr(R, "current_stream", lambda device: self.stream)
        monkeypatch.setattr(R, "quantize_expand_nvfp4", self.quantize_expand)
        monkeypatch.setattr(R, "prepack", lambda q, s: ("prepacked", tuple(q.shape)))
        monkeypatch.setattr(R, "gemm_nvfp4", self.gemm)

    def quantize(self, xc, g, out):
        """The ``_into`` kernel's contract: rows [0, m) of the ring's codes and scales written,
        nothing else (the rows past a partial chunk keep the previous chunk's bytes)."""
        q, s = out
        m, K = xc.shape
        rq, rs = nvfp4.quantize(xc, g, pad_16x=True)
        q[:m] = rq[:m]
        kb = K // nvfp4.BLOCK
        r, c = torch.meshgrid(torch.arange(m), torch.arange(kb), indexing="ij")
        off = nvfp4.swizzle_offset(r.reshape(-1), c.reshape(-1), kb)
        s.view(torch.uint8).view(-1)[off] = rs.view(torch.uint8).view(-1)[off]
        self.calls.append(("quantize", m, float(g)))

    def quantize_expand(self, xc, g, out):
        """The expanding kernel's contract: as :meth:`quantize`, plus f16 [m, K] = e2m1 · s."""
        q, s, f16 = out
        self.quantize(xc, g, (q, s))
        m, K = xc.shape
        rq, rs = nvfp4.quantize(xc, g, pad_16x=True)
        f16.copy_(nvfp4.dequantize(rq, rs, 1.0, (m, K), dtype=torch.float16)[:m])

    def gemm(self, a_q, a_s, g, w_q, w_s, g_w, *, rows, out, config, prepacked, gate, residual,
             a16=None):
        m, N, K = rows[1], w_q.shape[0], 2 * w_q.shape[1]
        assert rows[0] == 0 and out.shape == (m, N)
        if a16 is not None:  # an f16 build reads the expansion: it must be the chunk's rows
            want16 = nvfp4.dequantize(a_q, a_s, 1.0, (a_q.shape[0], K), dtype=torch.float16)
            assert torch.equal(a16[:m].view(torch.int16), want16[:m].view(torch.int16))
        d, _, _ = G.reference_gemm(a_q, a_s, w_q, w_s, float(g), g_w, m, N, K)
        y = d.to(torch.bfloat16)
        out.copy_(y if gate is None else gate_residual(y, gate, residual))
        self.calls.append(("gemm", m, config))


@pytest.mark.parametrize("M, rows, cap", [(300, None, 128), (1000, (128, 1000), 256),
                                          (640, (0, 512), 128), (200, None, 512)])
@pytest.mark.parametrize("fused", [False, True])
def test_ring_chunks_equal_the_whole_reference_call(M, rows, cap, fused, monkeypatch):
    """Every chunk (a partial last one included, rows from r0 > 0) equals the whole call's
    rows bit for bit: one g from the whole x, the whole call's config for every chunk."""
    from kernels.nvfp4 import ring as R

    fakes = _Fakes(R, monkeypatch)
    N, K = 48, 96  # K/16 = 6: the ring's scale padding columns are in play
    x, w_q, w_s, g_w = _operands(M, N, K, seed=M + cap)
    r0, r1 = rows or (0, M)
    gate = residual = None
    if fused:
        gen = torch.Generator().manual_seed(7)
        gate = torch.randn(N, generator=gen).to(torch.bfloat16)
        residual = torch.randn(r1 - r0, N, generator=gen).to(torch.bfloat16)
    g = nvfp4.global_scale(x).reshape(1)  # the WHOLE activation's
    monkeypatch.setattr(R.PackedRing, "__init__", _cpu_ring_init(R))
    plan = R.plan_ring(x, w_q, w_s, g_w, rows=rows, capacity=cap, gate=gate, residual=residual)
    # poison the ring: bytes no chunk writes must reach no stored output
    plan.ring.q.fill_(0x77)
    y = plan.run(g)
    wq, ws = nvfp4.quantize(x, g, pad_16x=True)
    d, _, _ = G.reference_gemm(wq, ws, w_q, w_s, float(g), g_w, M, N, K)
    want = d.to(torch.bfloat16)[r0:r1]
    if fused:
        want = gate_residual(want, gate, residual)
    assert torch.equal(y.view(torch.int16), want.view(torch.int16))
    gemms = [c for c in fakes.calls if c[0] == "gemm"]
    assert [c[1] for c in gemms] == [ch.rows for ch in P.chunk_plan(r0, r1, cap)]
    assert all(c[2] == ("whole", r1 - r0) for c in gemms)  # never the chunk's config
    assert [c[0] for c in fakes.calls] == ["quantize", "gemm"] * len(gemms)


def _cpu_ring_init(R):
    def init(self, capacity, K, device=None, f16=True):
        P.check_capacity(capacity)
        self.capacity, self.K, self.nbytes = capacity, K, P.ring_bytes(capacity, K, f16)
        self.q = torch.empty(capacity, K // 2, dtype=torch.uint8)
        self.s = torch.zeros(nvfp4.scale_shape(capacity, K), dtype=torch.uint8).view(
            torch.float8_e4m3fn)
        self.f16 = torch.empty(capacity, K, dtype=torch.float16) if f16 else None
        self.stream = R.current_stream(self.q.device)
    return init


@pytest.mark.parametrize("M, rows, cap", [(300, None, 128), (1000, (128, 1000), 256)])
def test_f16_ring_chunks_carry_their_expansion(M, rows, cap, monkeypatch):
    """With an f16 build as the whole call's config, each chunk is quantized and expanded into
    the ring (its f16 rows poisoned first) and the GEMM is handed the ring's f16 rows, which
    equal e2m1 · s of that chunk's packed rows; the output equals the whole reference call."""
    from kernels.nvfp4 import ring as R
    from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90
    fakes = _Fakes(R, monkeypatch)
    monkeypatch.setattr(R.PackedRing, "__init__", _cpu_ring_init(R))
    N, K = 32, 64
    x, w_q, w_s, g_w = _operands(M, N, K, seed=M + cap)
    g = nvfp4.global_scale(x).reshape(1)
    r0, r1 = (0, M) if rows is None else rows
    config = BlockscaledGemmSm90.swap_ab_f16(splits=1)
    plan = R.plan_ring(x, w_q, w_s, g_w, rows=rows, capacity=cap, config=config)
    assert plan.ring.f16 is not None and plan.ring.nbytes == P.ring_bytes(cap, K, True)
    plan.ring.f16.view(torch.int16).fill_(0x7C01)  # NaN: a row not written would show
    y = plan.run(g)
    wq, ws = nvfp4.quantize(x, g, pad_16x=True)
    d, _, _ = G.reference_gemm(wq, ws, w_q, w_s, float(g), g_w, M, N, K)
    assert torch.equal(y.view(torch.int16), d.to(torch.bfloat16)[r0:r1].view(torch.int16))
    assert [c[0] for c in fakes.calls] == ["quantize", "gemm"] * len(P.chunk_plan(r0, r1, cap))
    assert all(c[2] is config for c in fakes.calls if c[0] == "gemm")


def test_stream_k_ring_of_several_chunks_refused(monkeypatch):
    """A stream-K whole-call config cuts each tile's K by the whole call's tile count: chunks
    would get other bits, so more than one chunk is refused before anything runs; one chunk
    runs."""
    from kernels.nvfp4 import ring as R
    from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90
    fakes = _Fakes(R, monkeypatch)
    monkeypatch.setattr(R.PackedRing, "__init__", _cpu_ring_init(R))
    x, w_q, w_s, g_w = _operands(256, 16, 64, seed=3)
    config = BlockscaledGemmSm90.swap_ab_f16(stream_k=True)
    with pytest.raises(ValueError, match="stream-K"):
        R.plan_ring(x, w_q, w_s, g_w, capacity=128, config=config)
    R.plan_ring(x, w_q, w_s, g_w, capacity=256, config=config).run(
        nvfp4.global_scale(x).reshape(1))
    assert [c[0] for c in fakes.calls] == ["quantize", "gemm"]
    ring = R.PackedRing(128, 64, f16=False)  # packed only: refused (every config reads f16)
    with pytest.raises(ValueError, match="f16 rows exactly when"):
        R.plan_ring(x, w_q, w_s, g_w, ring=ring, config=BlockscaledGemmSm90.swap_ab_f16())


def test_ring_of_another_stream_refused_before_any_launch(monkeypatch):
    from kernels.nvfp4 import ring as R

    fakes = _Fakes(R, monkeypatch)
    monkeypatch.setattr(R.PackedRing, "__init__", _cpu_ring_init(R))
    x, w_q, w_s, g_w = _operands(256, 16, 64, seed=1)
    ring = R.PackedRing(128, 64)
    plan = R.plan_ring(x, w_q, w_s, g_w, ring=ring)
    assert plan.capacity == 128
    fakes.stream = "stream-1"
    with pytest.raises(ValueError, match="made on another stream"):
        plan.run(nvfp4.global_scale(x).reshape(1))
    assert fakes.calls == []
    with pytest.raises(ValueError, match="capacity = 256 but the ring holds 128"):
        R.plan_ring(x, w_q, w_s, g_w, ring=ring, capacity=256)
    with pytest.raises(TypeError, match="one-element float32"):
        fakes.stream = "stream-0"
        plan.run(0.5)
    assert fakes.calls == []


def test_ring_checks_before_the_device(monkeypatch):
    """Argument and shape errors are named before any device check (so on a CPU as well);
    with them right, a machine without a GPU is told so, and nothing launched."""
    from kernels.nvfp4 import ring as R

    x, w_q, w_s, g_w = _operands(300, 16, 64, seed=2)
    cases = [
        (dict(capacity=100), ValueError, "multiple of 128"),
        (dict(capacity=256.0), TypeError, "capacity must be an int"),
        (dict(rows=(64, 300)), ValueError, "multiple of 128"),
        (dict(rows=(0, 301)), ValueError, "0 <= r0 < r1 <= M = 300"),
        (dict(out=torch.empty(299, 16, dtype=torch.bfloat16)), ValueError, "out has shape"),
        (dict(gate=torch.empty(16, dtype=torch.bfloat16)), ValueError, "go together"),
        (dict(gate=torch.empty(8, dtype=torch.bfloat16),
              residual=torch.empty(300, 16, dtype=torch.bfloat16)), ValueError, "gate has shape"),
        (dict(config="p0"), TypeError, "BlockscaledGemmSm90"),
        (dict(ring="ring"), TypeError, "PackedRing"),
    ]
    for kw, err, msg in cases:
        with pytest.raises(err, match=msg):
            R.plan_ring(x, w_q, w_s, g_w, **kw)
    with pytest.raises(TypeError, match="x has dtype torch.float32"):
        R.plan_ring(x.float(), w_q, w_s, g_w)
    with pytest.raises(ValueError, match="w_q must be packed codes"):
        R.plan_ring(x[:, :32], w_q, w_s, g_w)
    if not HAVE_CUDA:
        with pytest.raises(WorkbenchError, match="no CUDA GPU"):
            R.plan_ring(x, w_q, w_s, g_w)


# --- Nvfp4Linear's p2 backend (CPU: resolution and refusals) -------------------------------
def test_p2_backend_resolution_and_capacity():
    w = torch.randn(64, 64).to(torch.bfloat16)
    if not HOPPER:
        with pytest.raises(BackendUnavailable, match="the p2 backend needs"):
            Nvfp4Linear(w, backend="p2", role="qkv")
        with pytest.raises(BackendUnavailable, match="the p2 backend needs"):
            Nvfp4Linear(w).with_backend("p2")
    with pytest.raises(ValueError, match="capacity"):
        Nvfp4Linear(w, ring_capacity=1000)
    lin = Nvfp4Linear(w, ring_capacity=512)
    assert lin.ring_capacity == 512 and lin.with_backend("reference").ring_capacity == 512
    assert Nvfp4Linear(w).ring_capacity == P.DEFAULT_CAPACITY


def test_fc2_stays_on_p0_under_p2():
    """The seed keeps FC2 off the streamed producers: p2 asked for FC2 runs p0."""
    if HOPPER:
        assert resolve_backend("p2", "fc2") == "p0"
        assert resolve_backend("p2", "qkv") == "p2"
    else:
        with pytest.raises(BackendUnavailable, match="the p0 backend needs"):
            resolve_backend("p2", "fc2")


# --- GPU: the kernels -----------------------------------------------------------------------
def _gpu_case(M, N, K, seed, heavy=True):
    from kernels.nvfp4.amax import amax
    from kernels.nvfp4.prepack import prepack

    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, generator=gen, device="cuda")
    if heavy:
        x = x * torch.exp(torch.randn(K, generator=gen, device="cuda"))
    x = x.to(torch.bfloat16)
    w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(torch.bfloat16)
    g_w = nvfp4.global_scale(w).reshape(1)
    w_q, w_s = nvfp4.quantize(w, g_w)
    g = nvfp4.global_scale_from_amax(amax(x)).reshape(1)
    return x, g, w_q, w_s, g_w, prepack(w_q, w_s)


def _p0_whole(x, g, w_q, w_s, g_w, pre, rows, config, gate=None, residual=None):
    from kernels.nvfp4.gemm import gemm_nvfp4
    from kernels.nvfp4.quantize import quantize_nvfp4

    q, s = quantize_nvfp4(x, g, pad_16x=True)  # gemm_nvfp4 expands it (expand_nvfp4)
    return gemm_nvfp4(q, s, g, w_q, w_s, g_w, rows=rows, config=config, prepacked=pre,
                      gate=gate, residual=residual)


def _first_bad_chunk(y, want, r0, r1, cap):
    for ch in P.chunk_plan(r0, r1, cap):
        a, b = ch.start - r0, ch.stop - r0
        if not torch.equal(y[a:b].view(torch.int16), want[a:b].view(torch.int16)):
            n = int((y[a:b].view(torch.int16) != want[a:b].view(torch.int16)).sum())
            return f"chunk {ch.index} rows [{ch.start}, {ch.stop}): {n} elements differ"
    return None


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K, rows, cap, with_prepack", [
    (1000, 1024, 512, None, 128, True),          # 8 chunks, the last 104 rows
    (1000, 1024, 512, None, 512, True),          # 2 chunks, the last 488 rows
    (2500, 5376, 5376, (128, 2500), 512, True),  # H3 width, rows from r0 = 128, 324-row last
    (300, 2048, 1056, None, 128, True),          # K/16 = 66: scale padding columns in the ring
    (300, 5376, 5376, None, 128, True),          # whole call swap-AB: chunks read the prepack
    (200, 2048, 2048, None, 128, True),          # swap-AB, K split 2: per-chunk workspace
    (300, 1024, 2048, None, 128, False),         # no prepack given: the ring makes it once
])
def test_every_chunk_bit_identical_to_p0_whole_call(M, N, K, rows, cap, with_prepack):
    from kernels.nvfp4.gemm import default_config
    from kernels.nvfp4.ring import ring_gemm

    x, g, w_q, w_s, g_w, pre = _gpu_case(M, N, K, seed=M + N + cap)
    r0, r1 = rows or (0, M)
    config = default_config(r1 - r0, N, K, stream_k=False)  # several chunks: no stream-K
    want = _p0_whole(x, g, w_q, w_s, g_w, pre, (r0, r1), config)
    out = torch.full((r1 - r0, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = ring_gemm(x, g, w_q, w_s, g_w, rows=rows, capacity=cap, config=config,
                  prepacked=pre if with_prepack else None, out=out)
    torch.cuda.synchronize()
    assert y is out and not torch.isnan(y).any(), "poisoned output not fully overwritten"
    assert _first_bad_chunk(y, want, r0, r1, cap) is None, _first_bad_chunk(y, want, r0, r1,
                                                                             cap)


@pytest.mark.gpu
def test_fused_gate_residual_through_the_ring_equals_p0():
    from kernels.nvfp4.gemm import default_config
    from kernels.nvfp4.ring import ring_gemm

    M, N, K, cap = 900, 1024, 1024, 256
    x, g, w_q, w_s, g_w, pre = _gpu_case(M, N, K, seed=11)
    gen = torch.Generator(device="cuda").manual_seed(12)
    gate = torch.randn(N, generator=gen, device="cuda").to(torch.bfloat16)
    residual = torch.randn(M, N, generator=gen, device="cuda").to(torch.bfloat16)
    config = default_config(M, N, K, stream_k=False)
    want = _p0_whole(x, g, w_q, w_s, g_w, pre, (0, M), config, gate, residual)
    y = ring_gemm(x, g, w_q, w_s, g_w, capacity=cap, config=config, prepacked=pre, gate=gate,
                  residual=residual)
    assert _first_bad_chunk(y, want, 0, M, cap) is None


@pytest.mark.gpu
def test_two_overlapping_requests_on_two_streams():
    """Two requests with different activations, each on its own stream, enqueued back to back
    with no host synchronisation between them: each output bit-identical to its own P0 call
    (each owns its ring: the allocator recycles a block only on its own stream)."""
    from kernels.nvfp4.gemm import default_config
    from kernels.nvfp4.ring import ring_gemm

    M, N, K, cap = 3000, 5376, 5376, 512
    cases = [_gpu_case(M, N, K, seed=s) for s in (21, 22)]
    config = default_config(M, N, K, stream_k=False)
    wants = [_p0_whole(*c, (0, M), config) for c in cases]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = []
    for _ in range(3):  # three rounds: rings freed by round i are reused in round i + 1
        for c, st in zip(cases, streams):
            st.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(st):
                x, g, w_q, w_s, g_w, pre = c
                outs.append(ring_gemm(x, g, w_q, w_s, g_w, capacity=cap, config=config,
                                      prepacked=pre))
    torch.cuda.synchronize()
    for i, y in enumerate(outs):
        bad = _first_bad_chunk(y, wants[i % 2], 0, M, cap)
        assert bad is None, f"request {i} (activation {i % 2}): {bad}"


@pytest.mark.gpu
@pytest.mark.parametrize("role", ["qkv", "out", "fc1", "fc2"])
def test_nvfp4_linear_p2_equals_p0_on_the_scaled_h3(role):
    """Nvfp4Linear p2 against p0 on the scaled H3's weights, bit for bit, plain and fused, with
    a row slice; fc2 resolves to p0 itself."""
    from models.h3 import QUICK, weight

    w = weight(QUICK, 0, 1, role).cuda()
    p0 = Nvfp4Linear(w, backend="p0", role=role)
    p2 = p0.with_backend("p2")
    p2.ring_capacity = 128
    assert p2.backend == ("p0" if role == "fc2" else "p2")
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(QUICK.tokens + 77, p0.K, generator=gen, device="cuda").to(torch.bfloat16)
    for rows in (None, (128, x.shape[0])):
        a, b = p0(x, rows=rows), p2(x, rows=rows)
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), rows
    gate = torch.randn(p0.N, generator=gen, device="cuda").to(torch.bfloat16)
    res = torch.randn(x.shape[0], p0.N, generator=gen, device="cuda").to(torch.bfloat16)
    a, b = p0(x, gate=gate, residual=res), p2(x, gate=gate, residual=res)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    # out=: both store every element into a caller's NaN-poisoned buffer (two patterns), as
    # experiments/p2_parity.py runs them
    o0, o2 = (torch.empty_like(a) for _ in range(2))
    o0.view(torch.int16).fill_(-1)
    o2.view(torch.int16).fill_(0x7FC1)
    assert p0(x, gate=gate, residual=res, out=o0) is o0
    assert p2(x, gate=gate, residual=res, out=o2) is o2
    assert torch.equal(o0.view(torch.int16), a.view(torch.int16))
    assert torch.equal(o2.view(torch.int16), a.view(torch.int16))
