"""P0 block-scaled NVFP4 GEMM: the dequant's PTX sequence modelled bit for bit, the shell's
checks and the input checks (CPU), compile checks (CI), exactness (GPU). Every build is an f16
build (the activation's f16 expansion by TMA, the weight's register-order prepack); the p0 and
packed swap-AB designs left with their tests in session 27 (``git show
e8e774c:tests/test_gemm_nvfp4.py``)."""
import functools
import os
import re
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels.nvfp4.gemm as E
from consumers.register_a_wgmma import RegisterAWgmmaConsumer
from device import waits
from device.barriers import Barrier, NamedBarrier
from epilogues.tile_store import TileStore
from kernels.nvfp4.gemm import gemm_nvfp4
from kernels.nvfp4.gemm_shell import (BlockscaledGemmSm90, P0Variant, P1Study, check_roles,
                                      compile_args)
from kernels.nvfp4.prepack import prepack
from kernels.nvfp4.quantize import expand_nvfp4
from numerics import gemm_oracle as G
from numerics.epilogue import gate_residual
from numerics.formats import e2m1_decode, e4m3_decode
from numerics.nvfp4 import unpack_codes
from producers.activation_stage import ClusterQuantizingActivationStage, F16TmaActivationStage
from producers.register_order import Bf16RegisterOrderProducer, WeightsOnlyRegisterOrderProducer
from validators.gemm_operands import make_operand
from workbench.compile import compile_report

# ---- the dequant word path (device.nvfp4.dequant_e2m1_word), modelled on uint32 ------
M32 = 0xFFFFFFFF


def _lop3(a, b, c, lut: int):
    """``lop3.b32``: result bit = bit (a·4 + b·2 + c) of ``lut``, for each bit position."""
    out = 0
    for i in range(8):
        if lut >> i & 1:
            out = out | ((a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c))
    return out & M32


def _prmt(a, b, selector: int):
    """``prmt.b32`` (default mode): result byte i = byte (selector nibble i) of {b, a}."""
    out = 0
    for i in range(4):
        k = selector >> 4 * i & 0xF
        assert k < 8, "sign-replicating selectors are not modelled (the dequant uses none)"
        src = a if k < 4 else b
        out = out | ((src >> 8 * (k % 4) & 0xFF) << 8 * i)
    return out


def _e2m1_bytes_as_e4m3(w):
    """{ shr.b32 t, w, 2; and.b32 t, t, 0x1C1C1C1C; lop3.b32 d, w, 0x80808080, t, 0xEA; }"""
    return _lop3(w, 0x80808080, (w >> 2) & 0x1C1C1C1C, 0xEA)


def _dequant_e4m3_bytes(w):
    """The E4M3 bytes dequant_e2m1_word converts, in element order (what cvt.rn.f16x2.e4m3x2
    turns into f16 pairs, low byte first): even = the high nibbles, odd = those of ``w << 4``."""
    even, odd = _e2m1_bytes_as_e4m3(w), _e2m1_bytes_as_e4m3((w << 4) & M32)
    lo, hi = _prmt(even, odd, 0x5140), _prmt(even, odd, 0x7362)
    return torch.stack([x >> 8 * i & 0xFF for x in (lo, hi) for i in range(4)], -1)


def test_dequant_word_path_decodes_every_byte_pair_exactly():
    """Every 16-bit half (all byte pairs, so a nibble leaking into its neighbour would show), in
    both halves of the word: the bytes the kernel converts are worth 2^-6 times the E2M1 value
    of the element numerics' unpack puts there (element 2j in the high nibble of byte j)."""
    half = torch.arange(1 << 16, dtype=torch.int64)
    words = half | ((half * 40503 + 12345) % (1 << 16)) << 16  # the high half: a permutation
    got = e4m3_decode(_dequant_e4m3_bytes(words).to(torch.uint8)).double() * 64
    packed = torch.stack([words >> 8 * i & 0xFF for i in range(4)], -1).to(torch.uint8)
    want = e2m1_decode(unpack_codes(packed), torch.float64)
    assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit())


def test_e2m1_times_scale_is_exact_in_f16():
    """x 64·scale in f16 (mul.rn.f16x2): 64·s is exact, and every product of a converted code
    and a finite scale is exact and normal (or zero) in f16, so the dequant never rounds."""
    codes = e4m3_decode(_dequant_e4m3_bytes(torch.arange(256, dtype=torch.int64)).flatten()
                        .to(torch.uint8)).double().unique()
    s = e4m3_decode(torch.arange(0x7F, dtype=torch.uint8)).double()
    s64 = (s * 64).to(torch.float16)
    assert torch.equal(s64.double(), s * 64)
    prod = codes.view(-1, 1) * s64.double().view(1, -1)
    assert torch.equal(prod.to(torch.float16).double(), prod)
    nz = prod[prod != 0].abs()
    assert nz.min() >= 2.0**-14 and nz.max() <= 65504


def _dequant_dataflow(ptx: str):
    """Per dequant prmt (0x5140 / 0x7362): does it combine lop3(w) and lop3(w << 4) of one
    word w, the sequence the tests above model?"""
    lop = {out: src for src, out in re.findall(
        r"shr\.b32 t, (%r\d+), 2; and\.b32 t, t, 0x1C1C1C1C; "
        r"lop3\.b32 (%r\d+), \1, 0x80808080, t, 0xEA;", ptx)}
    shl4 = dict(re.findall(r"shl\.b32\s+(%r\d+), (%r\d+), 4;", ptx))
    prmts = re.findall(r"prmt\.b32 %r\d+, (%r\d+), (%r\d+), 0x(?:5140|7362);", ptx)
    flow = []
    for even, odd in prmts:
        word = lop.get(even)
        flow.append(word is not None and shl4.get(lop.get(odd)) == word)
    return flow


# ---- compile (CI) ---------------------------------------------------------------------------
@pytest.mark.compile
def test_expand_kernel_runs_the_modelled_dequant():
    """expand_nvfp4's kernel converts its codes by the sequence the tests above model: per
    thread 2 rows x 2 code words, each one lop3(w) / lop3(w << 4) prmt pair."""
    from kernels.nvfp4 import quantize as Q
    r = compile_report(Q.EXPAND, *Q.ENTRY_EXPAND.compile_args(ffi=False), arch="sm_90a")
    flow = _dequant_dataflow(r.ptx)
    assert len(flow) == 2 * 2 * 2 and all(flow), flow


@pytest.mark.compile
@pytest.mark.parametrize("variant", ["skip_dequant", "skip_mma", "stall_producer"])
def test_measurement_variants_build_what_they_say(variant):
    """The measurement builds (on P1's, the one study that takes them) drop exactly their half
    of the mainloop; the stalled producer announces 16 bytes more than a stage holds (so its
    "full" barrier never completes)."""
    cfg = P1Study(variant=P0Variant(**{variant: True})).build()
    r = compile_report(cfg, *compile_args())
    assert r.census["wgmma.mma_async"] == (0 if variant == "skip_mma" else 4)
    consumer_cvts = 4 * (4 + 1)  # the weights' converts; the rest are the quantizer's
    assert (r.ptx.count("cvt.rn.f16x2.e4m3x2") > consumer_cvts) == (variant != "skip_dequant")
    # the stage's bytes: the bf16 tile's (a constant) + the valid slabs' (at run time)
    stalled = re.search(rf"\b{cfg.producer.act_bytes + 16}\b", r.ptx) is not None
    assert stalled == (variant == "stall_producer")


def test_swap_ab_f16_roles_and_barriers_are_checked_before_compiling():
    """The arrive counts the shell derives, and its refusals of an inconsistent role set."""
    cfg = BlockscaledGemmSm90.swap_ab_f16()
    counts = {k: v[1] for k, v in cfg.barrier_table.items()}
    assert counts == {"full": 1, "empty": 8, "act_full": 1, "act_empty": 8}
    assert cfg.cluster_n == 1 and cfg.threads == 512 and cfg.reads_f16_activation
    wide = BlockscaledGemmSm90.wide_f16()
    assert wide.threads == 384 and wide.tile_m == 256 and wide.reads_f16_activation
    with pytest.raises(ValueError, match=r"barrier 'act_full' has 0 arrivals"):
        check_roles((cfg.producer, cfg.consumer, _NoArrivals(cfg.activation)))
    with pytest.raises(ValueError, match=r"arrives on 'act_empty', which no role owns"):
        check_roles((cfg.producer, cfg.consumer))
    with pytest.raises(ValueError, match=r"buffers = 1: the consumers release a tile"):
        BlockscaledGemmSm90.swap_ab_f16(buffers=1)
    with pytest.raises(ValueError, match=r"tokens = 64: use a multiple of 128"):
        WeightsOnlyRegisterOrderProducer(64, 128, 8)


def test_shell_checks_what_crosses_between_modules():
    """A module built for another ring depth, other f16 tiles or another cluster, or an
    epilogue built for another thread count, is refused when the shell is built (each would
    compile to a kernel that hangs or races)."""
    act = F16TmaActivationStage(128, 8)
    with pytest.raises(ValueError, match=r"RegisterAWgmmaConsumer reads a ring of 4 stages; "
                                         r"WeightsOnlyRegisterOrderProducer fills 8"):
        BlockscaledGemmSm90.from_roles("swap_ab", WeightsOnlyRegisterOrderProducer(128, 128, 8),
                                       RegisterAWgmmaConsumer(128, 4, act.tiles), act)
    with pytest.raises(ValueError, match=r"RegisterAWgmmaConsumer reads f16 tiles"):
        BlockscaledGemmSm90.from_roles(
            "swap_ab", WeightsOnlyRegisterOrderProducer(128, 128, 8),
            RegisterAWgmmaConsumer(128, 8, F16TmaActivationStage(128, 8, 4).tiles), act)
    paired = ClusterQuantizingActivationStage(128, 8)  # writes two CTAs' f16 tiles
    with pytest.raises(ValueError, match=r"ClusterQuantizingActivationStage writes the f16 tiles "
                                         r"of 2 CTAs; RegisterAWgmmaConsumer frees them in 1"):
        BlockscaledGemmSm90.from_roles("swap_ab", Bf16RegisterOrderProducer(128, 128, 8),
                                       RegisterAWgmmaConsumer(128, 8, paired.tiles), paired)
    with pytest.raises(ValueError, match=r"the epilogue syncs 128 threads; "
                                         r"RegisterAWgmmaConsumer calls it from 256"):
        BlockscaledGemmSm90.from_roles("swap_ab", WeightsOnlyRegisterOrderProducer(128, 128, 8),
                                       RegisterAWgmmaConsumer(128, 8, act.tiles), act,
                                       epilogue=TileStore(128))
    with pytest.raises(ValueError, match=r"barrier = .*: a NamedBarrier other than"):
        TileStore(256, barrier=NamedBarrier.SYNC_THREADS)
    cfg = BlockscaledGemmSm90.swap_ab_f16(splits=2)
    assert cfg.epilogue == TileStore(256, splits=2) and cfg.consumer.threads == 256


def test_barrier_ids_keep_their_codes_and_the_report_names_the_barrier(monkeypatch):
    """The mailbox codes are what kernels write (immediates in the PTX) and what the host
    decodes; one enum holds them (device/barriers.py)."""
    assert {b.name: int(b) for b in Barrier} == {
        "FULL": 0, "EMPTY": 1, "ACT_FULL": 2, "ACT_EMPTY": 3, "PAGE_FULL": 4, "PAGE_EMPTY": 5,
        "FIX_FULL": 6, "FIX_FREE": 7, "COUNTER": 16, "PARTIAL": 17, "SLOT": 18}
    assert [int(b) for b in NamedBarrier] == [0, 1, 2]
    box = torch.zeros(8, dtype=torch.int32)
    box[:7] = torch.tensor([waits.MAILBOX_MAGIC, Barrier.EMPTY, 3, 1, 7, 42, 0])
    monkeypatch.setattr(waits, "_MAILBOX", box)
    assert waits.mailbox_report() == (
        "kernel timed out after 2 s waiting on the empty (producer waiting for consumers to "
        "release a stage) barrier (stage 3, parity 1) in CTA 7, thread 42")
    box[1:7] = torch.tensor([Barrier.PARTIAL, 2, 0, 5, 9, 1])
    assert "waiting for the pair CTA's partial (slot 2, parity 0)" in waits.mailbox_report()
    box[1:7] = torch.tensor([Barrier.FIX_FULL, 2, 1, 40, 17, 0])
    assert "on the fix_full (a K split waiting for its peers' partials in its shared memory) " \
        "barrier (stage 2, parity 1) in CTA 40" in waits.mailbox_report()


class _NoArrivals:
    """A role that owns its barriers but never arrives on them (a hang, refused)."""

    def __init__(self, role):
        self.role, self.warpgroups, self.regs = role, role.warpgroups, role.regs

    def barriers(self):
        return self.role.barriers()

    def arrivals(self):
        return {"empty": 4}

    def waits(self):
        return self.role.waits()


# ---- the production shell and its cache key (CPU) -------------------------------------------
@pytest.mark.parametrize("build,kw,exc,match", [
    ("swap_ab_f16", dict(stages=1), ValueError, r"stages = 1: the packed ring needs an int >= 2"),
    ("swap_ab_f16", dict(splits=0), ValueError, r"splits = 0: choose 1..16"),
    ("swap_ab_f16", dict(splits=2, stream_k=True), ValueError, r"stream-K cuts K itself"),
    ("wide_f16", dict(stages=30), ValueError, r"needs \d+ B of shared memory"),
    ("swap_ab_f16", dict(tile_n=256), TypeError, r"unexpected keyword argument 'tile_n'"),
    ("swap_ab", {}, AttributeError, r"swap_ab"),  # the packed swap-AB design (lost)
], ids=["stages", "splits", "stream-k-splits", "smem", "tile_n", "swap_ab"])
def test_shell_refuses_bad_and_lost_options(build, kw, exc, match):
    with pytest.raises(exc, match=match) as e:
        getattr(BlockscaledGemmSm90, build)(**kw)
    assert e.type is exc


def test_the_p0_constructor_is_gone():
    """The p0 design (BlockscaledGemmSm90(...)) lost and left the code: the constructor says
    how to build a config instead."""
    with pytest.raises(TypeError, match=r"swap_ab_f16, wide_f16, wide_f16_queue or from_roles"):
        BlockscaledGemmSm90(tile_n=128, stages=8)


def test_cache_key_tells_modules_and_variants_apart():
    """Same tiles, another producer class (or variant, split count, schedule or buffers):
    another compiled kernel. Equal static choices: one kernel."""
    class OtherProducer(WeightsOnlyRegisterOrderProducer):
        pass

    base = BlockscaledGemmSm90.swap_ab_f16()
    assert base.static_key() == BlockscaledGemmSm90.swap_ab_f16().static_key()
    act = F16TmaActivationStage(128, 8, 4)
    others = [BlockscaledGemmSm90.from_roles("swap_ab", OtherProducer(128, 128, 8),
                                             base.consumer, act, raster_along_m=False),
              P0Variant(skip_mma=True).of(base),
              BlockscaledGemmSm90.swap_ab_f16(splits=2),
              BlockscaledGemmSm90.swap_ab_f16(stream_k=True),
              BlockscaledGemmSm90.swap_ab_f16(buffers=2)]
    keys = {base.static_key(), *(c.static_key() for c in others)}
    assert len(keys) == 1 + len(others)
    # the production variant changes nothing
    assert P0Variant().of(base).static_key() == base.static_key()
    with pytest.raises(ValueError, match=r"producer tile \(256, 128\) differs"):
        BlockscaledGemmSm90.from_roles("swap_ab", WeightsOnlyRegisterOrderProducer(256, 128, 8),
                                       base.consumer, act)


# ---- input checks: one case each, on CPU (the CUDA requirement patched out) and on the GPU ----
class _CudaLooking(torch.Tensor):
    """A CPU tensor whose ``device`` reads cuda:0, so check_cuda_tensor's other checks run."""

    @property
    def device(self):
        return torch.device("cuda", 0)


@pytest.fixture
def cpu_stands_in_for_cuda(monkeypatch):
    """validate() without a GPU: no Hopper check, and CPU tensors pass the CUDA-device check
    (a meta tensor still fails it); every other check runs unchanged."""
    real = E.check_cuda_tensor

    def check(name, t, **kw):
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            t = t.as_subclass(_CudaLooking)
        real(name, t, **kw)

    monkeypatch.setattr(E, "require_hopper", lambda: None)
    monkeypatch.setattr(E, "check_cuda_tensor", check)


ARGS = ("a_q", "a_s", "g_a", "b_q", "b_s", "g_b")
# id: (replacements of a valid 128 x 256 x 256 call, given its operands o; exception; message)
BAD_INPUTS = {
    "a_q not a tensor": (lambda o: dict(a_q=None), TypeError,
                         r"a_q must be a torch\.Tensor, got NoneType"),
    "a_q dtype": (lambda o: dict(a_q=o["a_q"].float()), TypeError,
                  r"a_q has dtype float32; expected uint8"),
    "a_q device": (lambda o: dict(a_q=o["a_q"].to(o["elsewhere"])), ValueError,
                   r"a_q is on (meta|cpu); this kernel needs a CUDA tensor"),
    "b_q contiguous": (lambda o: dict(b_q=o["b_q"].t().contiguous().t()), ValueError,
                       r"b_q must be contiguous"),
    "K mismatch": (lambda o: dict(a_q=o["a_q"][:, :64].contiguous(),
                                  a_s=o["a_s"][:, :8].contiguous()), ValueError,
                   r"K mismatch: a_q holds K = 128, b_q holds K = 256"),
    "K multiple of 32": (lambda o: dict(a_q=o["a_q"][:, :8].contiguous(),
                                        a_s=o["a_s"][:, :4].contiguous(),
                                        b_q=o["b_q"][:, :8].contiguous(),
                                        b_s=o["b_s"][:, :4].contiguous()), ValueError,
                         r"a_q has K/2 = 8 bytes per row; K must be a multiple of 32"),
    "a_s shape": (lambda o: dict(a_s=o["a_s"][:, :4].contiguous()), ValueError,
                  (r"a_s has shape \(128, 4\); a_q \[128, 128\] needs the swizzled scale "
                   r"shape \[128, 16\]")),
    "N multiple of 8": (lambda o: dict(b_q=o["b_q"][:4].contiguous(),
                                       b_s=o["b_s"][:128].contiguous()), ValueError,
                        r"N = 4 must be a multiple of 8"),
    "rows start": (lambda o: dict(rows=(64, 128)), ValueError,
                   r"rows start r0 = 64 must be a multiple of 128"),
    "rows range": (lambda o: dict(rows=(0, 129)), ValueError,
                   r"rows = \(0, 129\) must satisfy 0 <= r0 < r1 <= M = 128"),
    "g_a numel": (lambda o: dict(g_a=torch.ones(2, device=o["device"])), ValueError,
                  r"g_a must hold one fp32 value; it has 2"),
    "g_b dtype": (lambda o: dict(g_b=torch.ones(1, dtype=torch.float64, device=o["device"])),
                  TypeError, r"g_b has dtype float64; expected float32"),
    "out shape": (lambda o: dict(out=torch.empty(128, 255, dtype=torch.bfloat16,
                                                 device=o["device"])), ValueError,
                  r"out has shape \(128, 255\); need \[128, 256\]"),
    "out dtype": (lambda o: dict(out=torch.empty(128, 256, dtype=torch.float16,
                                                 device=o["device"])), TypeError,
                  r"out has dtype float16; expected bfloat16"),
    "config": (lambda o: dict(config="fast"), TypeError,
               r"config must be a BlockscaledGemmSm90, got str"),
    "gate alone": (lambda o: dict(gate=torch.zeros(256, dtype=torch.bfloat16,
                                                   device=o["device"])), ValueError,
                   r"gate and residual go together"),
    "gate shape": (lambda o: dict(gate=torch.zeros(255, dtype=torch.bfloat16, device=o["device"]),
                                  residual=torch.zeros(128, 256, dtype=torch.bfloat16,
                                                       device=o["device"])), ValueError,
                   r"gate has shape \(255,\); need \[256\]"),
    "residual dtype": (lambda o: dict(gate=torch.zeros(256, dtype=torch.bfloat16,
                                                       device=o["device"]),
                                      residual=torch.zeros(128, 256, device=o["device"])),
                       TypeError, r"residual has dtype float32; expected bfloat16"),
}


def _assert_rejected(case: str, device: str, elsewhere: str):
    (aq, as_, ga), (bq, bs, gb) = _operands("raw", "raw", 128, 256, 256, seed=3, device=device)
    o = dict(zip(ARGS, (aq, as_, ga, bq, bs, gb)), device=device, elsewhere=elsewhere)
    changes, exc, match = BAD_INPUTS[case]
    kw = changes(o)
    args = [kw.pop(n) if n in kw else o[n] for n in ARGS]
    with pytest.raises(exc, match=match) as e:
        gemm_nvfp4(*args, **kw)
    assert e.type is exc, f"{e.type.__name__}, not {exc.__name__}"


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_p0_rejects_bad_input_before_launch(case, cpu_stands_in_for_cuda):
    _assert_rejected(case, "cpu", elsewhere="meta")


@pytest.mark.gpu
@pytest.mark.parametrize("case", BAD_INPUTS)
def test_p0_rejects_bad_input_before_launch_on_the_gpu(case):
    _assert_rejected(case, "cuda", elsewhere="cpu")
    torch.cuda.synchronize()  # nothing was launched that could fail later


# ---- GPU ------------------------------------------------------------------------------------
def _operands(kind_a, kind_b, M, N, K, seed, device="cuda"):
    a = make_operand(kind_a, M, K, seed, device)
    b = make_operand(kind_b, N, K, seed + 1, device)
    return a, b


def _check(out, a, b, M, N, K, row_ids=None):
    (aq, as_, ga), (bq, bs, gb) = a, b
    d, real, bound = G.reference_gemm(aq, as_, bq, bs, ga, gb, M, N, K, row_ids=row_ids)
    got = out.double() if row_ids is None else out[row_ids.to(out.device)].double()
    err = (got - real).abs()
    bad = ~(err <= bound)
    assert not bad.any(), (f"{int(bad.sum())} of {bad.numel()} elements outside the fp32 bound; "
                           f"first at {bad.nonzero()[0].tolist()}")
    return float((got == d.double()).float().mean())


def _within_bound_and_deterministic(kinds, shape, seed, config=None):
    """Poisoned output, every element within the oracle's fp32 bound, a rerun bit-identical."""
    M, N, K = shape
    a, b = _operands(*kinds, M, N, K, seed=seed)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")  # poison
    gemm_nvfp4(*a, *b, out=out, config=config)
    _check(out, a, b, M, N, K)
    again = gemm_nvfp4(*a, *b, config=config)
    assert torch.equal(out.view(torch.int16), again.view(torch.int16)), "two runs differ"


@pytest.mark.gpu
@pytest.mark.fast
def test_p0_small_gemm_within_fp32_bound_and_deterministic():
    """The fast GPU subset's P0 check: one ragged shape, the whole operand space, default config."""
    _within_bound_and_deterministic(("raw", "raw"), (130, 264, 96), seed=130)


# the f16 builds gemm_nvfp4 picks among (schedules/plan.py), by name
F16_CONFIGS = {"swap-s1": lambda: BlockscaledGemmSm90.swap_ab_f16(),
               "swap-s3": lambda: BlockscaledGemmSm90.swap_ab_f16(splits=3),
               "swap-stream-k": lambda: BlockscaledGemmSm90.swap_ab_f16(stream_k=True),
               "wide": lambda: BlockscaledGemmSm90.wide_f16(),
               "wide-stream-k": lambda: BlockscaledGemmSm90.wide_f16(stream_k=True)}


@pytest.mark.gpu
@pytest.mark.parametrize("kinds", [("normal", "normal"), ("lognormal", "normal"), ("raw", "raw"),
                                   ("cancel", "cancel")])
@pytest.mark.parametrize("shape", [(1, 8, 32), (130, 264, 96), (300, 520, 1056),
                                   (256, 1024, 5376)])
@pytest.mark.parametrize("config", F16_CONFIGS)
def test_p0_within_fp32_bound_and_deterministic(kinds, shape, config):
    """Each f16 build through gemm_nvfp4's conveniences (no a16, no prepack: both made per
    call): poisoned output, every element within the bound, a rerun bit-identical."""
    M, N, K = shape
    _within_bound_and_deterministic(kinds, shape, M * 7 + N + K + len(config),
                                    F16_CONFIGS[config]())


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 8, 32), (130, 264, 96), (700, 256, 512),
                                   (2048, 5376, 5376)])
def test_p0_conveniences_equal_the_production_call(shape):
    """gemm_nvfp4 without a16 and prepacked (the expansion into this stream's scratch and the
    prepack made per call) gives the production call's bits (both given, as Nvfp4Linear
    passes them), on the default config, whole and on row slices; the scratch is reused."""
    M, N, K = shape
    a, b = _operands("lognormal", "normal", M, N, K, seed=sum(shape))
    pre, a16 = prepack(b[0], b[1]), expand_nvfp4(a[0], a[1])
    want = gemm_nvfp4(*a, *b, prepacked=pre, a16=a16)
    for _ in range(2):  # the second call: the plan cache's fast path, the scratch reused
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        gemm_nvfp4(*a, *b, out=out)
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert E.a16_scratch(M, K, a[0].device) is E.a16_scratch(M, K, a[0].device)
    if M > 128:
        r0, r1 = 128, M
        part = gemm_nvfp4(*a, *b, rows=(r0, r1), config=E.default_config(M, N, K))
        assert torch.equal(part.view(torch.int16), want[r0:r1].view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("N,K", [(21504, 5376), (5376, 5376), (14336, 5376), (5376, 14336)])
@pytest.mark.parametrize("M", [128, 2048])
def test_p0_h3_projection_shapes(M, N, K):
    a, b = _operands("normal", "normal", M, N, K, seed=M + N + K)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_nvfp4(*a, *b, out=out)
    assert not torch.isnan(out).any(), "unwritten (poisoned) elements remain"
    rows = torch.randperm(M, generator=torch.Generator().manual_seed(M))[:128].sort().values
    _check(out, a, b, M, N, K, row_ids=rows.cuda())


@pytest.mark.gpu
@settings(max_examples=25, deadline=None)
@given(M=st.integers(1, 600), n8=st.integers(1, 80), k32=st.integers(1, 40),
       kinds=st.sampled_from([("normal", "normal"), ("raw", "raw"), ("lognormal", "cancel")]),
       seed=st.integers(0, 2**31 - 1))
def test_p0_drawn_shapes(M, n8, k32, kinds, seed):
    N, K = 8 * n8, 32 * k32
    a, b = _operands(*kinds, M, N, K, seed)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_nvfp4(*a, *b, out=out)
    _check(out, a, b, M, N, K)


def _swap_ab_within_bound(M, N, K, seed, splits=1, kinds=("normal", "lognormal"), cfg=None):
    """The production call (prepack and f16 expansion given): poisoned output, every element
    within the oracle's bound, a rerun bit-identical, P4's fused output bit-identical to the
    reference order on this build too."""
    cfg = cfg or BlockscaledGemmSm90.swap_ab_f16(splits=splits)
    a, b = _operands(*kinds, M, N, K, seed=seed)
    pre, a16 = prepack(b[0], b[1]), expand_nvfp4(a[0], a[1])
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_nvfp4(*a, *b, out=out, config=cfg, prepacked=pre, a16=a16)
    _check(out, a, b, M, N, K)
    again = gemm_nvfp4(*a, *b, config=cfg, prepacked=pre, a16=a16)
    assert torch.equal(out.view(torch.int16), again.view(torch.int16)), "two runs differ"
    gate = torch.randn(N, device="cuda").to(torch.bfloat16)
    res = torch.randn(M, N, device="cuda").to(torch.bfloat16)
    fused = gemm_nvfp4(*a, *b, config=cfg, prepacked=pre, a16=a16, gate=gate, residual=res)
    want = gate_residual(out, gate, res)
    assert torch.equal(fused.view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.fast
def test_swap_ab_small_gemm_within_fp32_bound_and_deterministic():
    _swap_ab_within_bound(130, 264, 96, seed=7)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 8, 32), (300, 520, 1056), (256, 1024, 5376),
                                   (128, 5376, 5376), (700, 384, 160)])
@pytest.mark.parametrize("splits", [1, 3])
def test_swap_ab_within_fp32_bound_and_deterministic(shape, splits):
    _swap_ab_within_bound(*shape, seed=sum(shape) + splits, splits=splits)


@pytest.mark.gpu
@settings(max_examples=15, deadline=None)
@given(M=st.integers(1, 500), n8=st.integers(1, 70), k32=st.integers(1, 30),
       kinds=st.sampled_from([("normal", "normal"), ("raw", "raw"), ("lognormal", "cancel")]),
       seed=st.integers(0, 2**31 - 1))
def test_swap_ab_drawn_shapes(M, n8, k32, kinds, seed):
    _swap_ab_within_bound(M, 8 * n8, 32 * k32, seed, kinds=kinds)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 8, 32), (128, 512, 2048), (300, 520, 1056),
                                   (256, 1024, 5376), (128, 5376, 5376), (700, 384, 160)])
def test_swap_ab_stream_k_within_fp32_bound_and_deterministic(shape):
    """Stream-K (device.tiles.StreamKSchedule): one CTA for the single k-block of (1, 8, 32);
    32 CTAs' segments a tile at (128, 512, 2048) (4 tiles x 32 k-blocks over 128 CTAs); ragged
    M, N and K; partial tiles under the whole-tile workspace."""
    _swap_ab_within_bound(*shape, seed=sum(shape) + 11,
                          cfg=BlockscaledGemmSm90.swap_ab_f16(stream_k=True))


@pytest.mark.gpu
@settings(max_examples=10, deadline=None)
@given(M=st.integers(1, 400), n8=st.integers(1, 90), k32=st.integers(1, 40),
       seed=st.integers(0, 2**31 - 1))
def test_swap_ab_stream_k_drawn_shapes(M, n8, k32, seed):
    _swap_ab_within_bound(M, 8 * n8, 32 * k32, seed, kinds=("lognormal", "cancel"),
                          cfg=BlockscaledGemmSm90.swap_ab_f16(stream_k=True))


@pytest.mark.gpu
def test_swap_ab_row_slices_and_refuses_a_wrong_prepack():
    cfg = BlockscaledGemmSm90.swap_ab_f16()
    M, N, K = 700, 256, 512
    a, b = _operands("normal", "lognormal", M, N, K, seed=13)
    pre, a16 = prepack(b[0], b[1]), expand_nvfp4(a[0], a[1])
    full = gemm_nvfp4(*a, *b, config=cfg, prepacked=pre, a16=a16)
    for r0, r1 in ((128, 700), (256, 257)):
        part = gemm_nvfp4(*a, *b, rows=(r0, r1), config=cfg, prepacked=pre, a16=a16)
        assert torch.equal(part.view(torch.int16), full[r0:r1].view(torch.int16)), (r0, r1)
    with pytest.raises(TypeError, match=r"pass prepacked= a PrepackedWeights"):
        gemm_nvfp4(*a, *b, config=cfg, prepacked=(b[0], b[1]), a16=a16)
    other = prepack(*_operands("normal", "normal", M, 128, K, seed=1)[1][:2])
    with pytest.raises(ValueError, match=r"prepacked holds a \[128, 512\] weight"):
        gemm_nvfp4(*a, *b, config=cfg, prepacked=other, a16=a16)
    with pytest.raises(ValueError, match=r"config must be an f16 build"):
        gemm_nvfp4(*a, *b, config=P1Study().build(), prepacked=pre, a16=a16)


_STALL = """
import torch
from kernels.nvfp4.gemm_p1 import gemm_nvfp4_p1
from kernels.nvfp4.gemm_shell import P0Variant, P1Study
from kernels.nvfp4.prepack import prepack
from device.waits import synchronize
from validators.gemm_operands import make_operand
x = torch.randn(128, 256, device="cuda").to(torch.bfloat16)
g = torch.ones(1, device="cuda")
b = make_operand("normal", 256, 256, 2, "cuda")
stall = P1Study(variant=P0Variant(stall_producer=True)).build()
gemm_nvfp4_p1(x, g, prepack(b[0], b[1]), g, config=stall)
synchronize()
"""


@pytest.mark.gpu
def test_stalled_barrier_traps_with_a_message_naming_it():
    """A wait that can never complete must end the kernel (not hang) and say which barrier
    (P1's producer announcing 16 bytes more than its stage holds)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", _STALL], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode != 0
    assert "timed out after 2 s waiting on the" in r.stderr and "barrier (stage" in r.stderr, \
        r.stderr[-2000:]
