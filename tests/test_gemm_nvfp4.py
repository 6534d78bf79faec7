"""P0 block-scaled NVFP4 GEMM: the dequant's PTX sequence modelled bit for bit and the input
checks (CPU), compile checks (CI), exactness (GPU)."""
import functools
import os
import re
import subprocess
import sys

import cutlass.cute as cute
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels.nvfp4.gemm as E
from consumers.dequant_wgmma import F16_BUFFERS, DequantWgmmaConsumer
from consumers.register_a_wgmma import RegisterAWgmmaConsumer
from device import waits
from device.barriers import Barrier, NamedBarrier
from epilogues.tile_store import TileStore
from kernels.nvfp4.gemm import default_config, gemm_nvfp4
from kernels.nvfp4.gemm_shell import (BlockscaledGemmSm90, P0Variant, SwapAbStudy, check_roles,
                                      compile_args)
from kernels.nvfp4.prepack import prepack
from numerics import gemm_oracle as G
from numerics.epilogue import gate_residual
from numerics.formats import e2m1_decode, e4m3_decode
from numerics.nvfp4 import unpack_codes
from producers.activation_stage import ExpandedActivationStage, ClusterQuantizingActivationStage
from producers.register_order import Bf16RegisterOrderProducer, RegisterOrderProducer
from producers.tma_prepacked import TmaPrepackedProducer
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
# id: (tile_n, stages, splits); ids keep the "tile_m-tile_n-stages-buffers-splits" names of the
# builds before the lost options left, so PTX dumps (WB_PTX_DUMP) compare file by file
P0_BUILDS = {"128-256-4-3-1": (256, 4, 1), "128-128-8-3-1": (128, 8, 1),
             "128-128-8-3-3": (128, 8, 3)}


@functools.cache
def _p0_build(tile_n: int, stages: int, splits: int):
    """(config, its cache key before compiling, compile report), compiled once per session."""
    cfg = BlockscaledGemmSm90(tile_n=tile_n, stages=stages, splits=splits)
    key = cfg.static_key()
    return cfg, key, compile_report(cfg, *compile_args())


@pytest.mark.compile
@pytest.mark.parametrize("build", P0_BUILDS)
def test_p0_compiles_with_the_instructions_we_meant(build):
    tile_n, _, splits = P0_BUILDS[build]
    cfg, key, r = _p0_build(*P0_BUILDS[build])
    assert cfg.static_key() == key, "compiling must not change the compile cache's key"
    # split-K: one acq_rel arrival per tile, partials read back coherently
    assert r.census["atom"] == (1 if splits > 1 else 0)
    assert ("ld.relaxed.gpu" in r.ptx) == (splits > 1)
    assert r.census["wgmma.mma_async"] == 4, "4 k16 per 64-row slab and k-block"
    assert f"m64n{tile_n}k16.f32.f16.f16" in r.ptx
    assert r.census["cp.async.bulk.tensor"] == 4, "TMA for codes A, B and scales A, B"
    assert r.census["setmaxnreg"] == 2 and r.census["fence.proxy.async"] >= 1
    assert r.ptx.count("cvt.rn.f16x2.e4m3x2") >= 16 and "ld.shared.v4" in r.ptx
    assert r.ptx.count("st.shared.v4") >= 4 and "st.global.b32" in r.ptx
    # the dequant is the modelled sequence: 2 prmts per packed word, 4 words per 16-byte chunk,
    # one chunk of A and tile_n / 128 of B per thread and k-block
    flow = _dequant_dataflow(r.ptx)
    assert len(flow) == 2 * 4 * (1 + tile_n // 128) and all(flow), flow
    assert r.frame_bytes == 0 and r.registers <= 232


@pytest.mark.compile
@pytest.mark.parametrize("build", P0_BUILDS)
def test_p0_sass_has_no_call_and_the_wgmma_we_meant(build):
    tile_n = P0_BUILDS[build][0]
    r = _p0_build(*P0_BUILDS[build])[2]
    if r.sass is None:
        pytest.skip("nvdisasm is not installed (pip nvidia-cuda-nvdisasm): SASS not checked")
    assert r.spill_bytes == 0
    # no call in the kernel: ptxas would serialise every wgmma (a DEPBAR after each HGMMA)
    assert "CALL.ABS" not in r.sass and r.sass.count("WARPGROUP.DEPBAR") <= 2
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in r.sass, "one wgmma group in flight"
    assert f"HGMMA.64x{tile_n}x16.F32" in r.sass


# SASS instructions of P0's k-loop at 1515c0c, the build behind results/p0-baseline.json before
# session 16: the module refactor grew it to 375 (128 x 256) and P0 lost ~10 % at M = 2048 (its
# ring index math left the uniform datapath; notes/p0-gemm.md, v7)
P0_KLOOP_AT_1515C0C = {256: 354, 128: 261}


def _k_loop(sass: str) -> list:
    """The instructions of the consumer's k-loop: from the target of the branch after the
    k-block's last HGMMA (the one that commits the group) back to that branch."""
    lines = sass.splitlines()
    last = next(i for i, ln in enumerate(lines) if "HGMMA" in ln and "gsb0" in ln)
    j = next(i for i in range(last, len(lines)) if "BRA" in lines[i])
    label = re.search(r"\(\.(L_x_\d+)\)", lines[j]).group(1)
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith(f".{label}:"))
    return [m.group(1) for ln in lines[start:j + 1]
            if (m := re.match(r"\s+/\*[0-9a-f]+\*/\s+(.*?)\s*;", ln))]


@pytest.mark.compile
@pytest.mark.parametrize("build", P0_BUILDS)
def test_p0_k_loop_did_not_grow(build):
    """The k-loop is issue-bound (the f16 expansion shares issue slots with the MMA): a few
    instructions more per k-block cost measurable time. The ring's index math stays on the
    uniform datapath (the full barrier's address is a uniform register)."""
    r = _p0_build(*P0_BUILDS[build])[2]
    if r.sass is None:
        pytest.skip("nvdisasm is not installed (pip nvidia-cuda-nvdisasm): SASS not checked")
    body = _k_loop(r.sass)
    assert sum(ins.startswith("HGMMA") for ins in body) == 4, "not the k-loop"
    limit = P0_KLOOP_AT_1515C0C[P0_BUILDS[build][0]] + 4
    assert len(body) <= limit, f"k-loop has {len(body)} instructions (1515c0c: {limit - 4})"
    assert any(re.search(r"TRYWAIT P0, \[UR\d+\]", ins) for ins in body)
    assert not any(ins.startswith("BSSY") for ins in body), "no divergent region in the loop"


@pytest.mark.compile
@pytest.mark.parametrize("variant", ["skip_dequant", "skip_mma", "stall_producer"])
def test_p0_variants_build_what_they_say(variant):
    """The measurement builds drop exactly their half of the mainloop; the stalled producer
    announces 16 bytes more than a stage holds (so its "full" barrier never completes)."""
    cfg = P0Variant(**{variant: True}).of(BlockscaledGemmSm90(tile_n=128, stages=8))
    r = compile_report(cfg, *compile_args())
    assert r.census["wgmma.mma_async"] == (0 if variant == "skip_mma" else 4)
    assert ("cvt.rn.f16x2.e4m3x2" in r.ptx) == (variant != "skip_dequant")
    regs = re.findall(r"mbarrier\.arrive\.expect_tx\.shared\.b64 %rd\d+, \[%r\d+\], (%r\d+);",
                      r.ptx)
    announced = {int(re.search(rf"mov\.b32\s+{reg}, (\d+);", r.ptx).group(1)) for reg in regs}
    assert announced == {cfg.producer.stage_bytes + (16 if variant == "stall_producer" else 0)}


# ---- the swap-AB design (compile) -------------------------------------------------------------
SWAP_AB_BUILDS = {"swap_ab-128-8-1": (128, 8, 1), "swap_ab-128-8-3": (128, 8, 3)}


@functools.cache
def _swap_ab_build(tokens: int, stages: int, splits: int):
    cfg = SwapAbStudy(tokens=tokens, stages=stages, splits=splits).build()
    return cfg, compile_report(cfg, *compile_args())


@pytest.mark.compile
@pytest.mark.parametrize("build", SWAP_AB_BUILDS)
def test_swap_ab_compiles_with_the_instructions_we_meant(build):
    """Weights as wgmma's register A operand, the activation expanded once by its own role:
    per k-block a consumer thread converts its 32 weight elements with 16 packed converts and
    16 packed multiplies (1 + 1 per two elements; + 4 + 4 for its 8 scales, 4 k16 steps x
    (4 + 1)); the activation stage's thread expands 2 chunks of 32 codes (17 + 17 each)."""
    tokens, _, splits = SWAP_AB_BUILDS[build]
    cfg, r = _swap_ab_build(*SWAP_AB_BUILDS[build])
    assert r.census["wgmma.mma_async"] == 4
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{tokens}k16\.f32\.f16\.f16 "
                     r"\{[^}]*\}, \{%r\d+,%r\d+,%r\d+,%r\d+\}", r.ptx), "A from registers"
    chunks = 2 * tokens // 128  # 16-byte packed chunks a stage thread expands per k-block
    assert r.ptx.count("cvt.rn.f16x2.e4m3x2") == 4 * (4 + 1) + 17 * chunks
    assert r.ptx.count("mul.rn.f16x2") == 4 * (4 + 1) + 17 * chunks
    assert r.census["cp.async.bulk.tensor"] == 2, "TMA: activation codes and scales"
    assert "multicast" not in r.ptx and "barrier.cluster" not in r.ptx
    assert r.ptx.count("cp.async.bulk.shared::cluster.global.mbarrier") == 4, "2 weight slabs"
    assert r.ptx.count("ld.shared.v4") == 1 + chunks and r.ptx.count("ld.shared.v2") == 1
    assert r.ptx.count("shfl.sync.bfly") == tokens // 4, "one swap per accumulator pair"
    assert r.census["setmaxnreg"] == 3 and r.census["atom"] == (1 if splits > 1 else 0)
    assert r.frame_bytes == 0 and r.registers <= 128
    if r.sass is not None:
        assert r.spill_bytes == 0 and "CALL.ABS" not in r.sass
        assert r.sass.count(f"HGMMA.64x{tokens}x16.F32") == 4
        # each k-block's group retires before the A registers are rewritten, nothing more
        assert r.sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x0") == 1
        assert r.sass.count("WARPGROUP.DEPBAR") == 1, "no serialised wgmma"


def test_swap_ab_roles_and_barriers_are_checked_before_compiling():
    """The arrive counts the shell derives, and its refusals of an inconsistent role set."""
    cfg = SwapAbStudy(tokens=128).build()
    counts = {k: v[1] for k, v in cfg.barrier_table.items()}
    assert counts == {"full": 1, "empty": 12, "act_full": 4, "act_empty": 8}
    assert cfg.cluster_n == 1
    assert cfg.threads == 512 and cfg.needs_prepacked_weights
    assert {k: v[1] for k, v in BlockscaledGemmSm90(tile_n=128, stages=8)
            .barrier_table.items()} == {"full": 1, "empty": 8}
    with pytest.raises(ValueError, match=r"barrier 'act_full' has 0 arrivals"):
        check_roles((cfg.producer, cfg.consumer, _NoArrivals(cfg.activation)))
    with pytest.raises(ValueError, match=r"arrives on 'act_empty', which no role owns"):
        check_roles((cfg.producer, cfg.consumer))
    with pytest.raises(ValueError, match=r"tokens = 64: choose"):
        SwapAbStudy(tokens=64).build()
    with pytest.raises(ValueError, match=r"roles ask for 72704 registers"):
        SwapAbStudy(tokens=256).build()  # 256 tokens need the three-warpgroup f16 build
    with pytest.raises(ValueError, match=r"buffers = 1: the activation stage needs >= 2"):
        SwapAbStudy(buffers=1).build()
    # the production build is the study's default setting
    assert BlockscaledGemmSm90.swap_ab(stages=8, splits=3).static_key() == \
        SwapAbStudy(splits=3).build().static_key()


def test_shell_checks_what_crosses_between_modules():
    """A module built for another ring depth, other f16 tiles or another cluster, or an
    epilogue built for another thread count or on the consumer's named barrier, is refused when
    the shell is built (each would compile to a kernel that hangs or races)."""
    with pytest.raises(ValueError, match=r"DequantWgmmaConsumer reads a ring of 4 stages; "
                                         r"TmaPrepackedProducer fills 8"):
        BlockscaledGemmSm90(tile_n=128, stages=8, consumer=DequantWgmmaConsumer(128, 128, 4))
    act = ExpandedActivationStage(128, 8)
    with pytest.raises(ValueError, match=r"RegisterAWgmmaConsumer reads f16 tiles"):
        BlockscaledGemmSm90.from_roles(
            "swap_ab", RegisterOrderProducer(128, 128, 8),
            RegisterAWgmmaConsumer(128, 8, ExpandedActivationStage(128, 8, 4).tiles), act)
    paired = ClusterQuantizingActivationStage(128, 8)  # writes two CTAs' f16 tiles
    with pytest.raises(ValueError, match=r"ClusterQuantizingActivationStage writes the f16 tiles "
                                         r"of 2 CTAs; RegisterAWgmmaConsumer frees them in 1"):
        BlockscaledGemmSm90.from_roles("swap_ab", Bf16RegisterOrderProducer(128, 128, 8),
                                       RegisterAWgmmaConsumer(128, 8, paired.tiles), paired)
    with pytest.raises(ValueError, match=r"the epilogue syncs 128 threads; "
                                         r"DequantWgmmaConsumer calls it from 256"):
        BlockscaledGemmSm90(tile_n=128, stages=8, epilogue=TileStore(128))
    with pytest.raises(ValueError, match=r"named barrier .* is also DequantWgmmaConsumer's"):
        BlockscaledGemmSm90(tile_n=128, stages=8,
                            epilogue=TileStore(256, barrier=NamedBarrier.CONSUMERS))
    with pytest.raises(ValueError, match=r"barrier = .*: a NamedBarrier other than"):
        TileStore(256, barrier=NamedBarrier.SYNC_THREADS)
    cfg = BlockscaledGemmSm90(tile_n=128, stages=8, splits=2)
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
@pytest.mark.parametrize("kw,exc,match", [
    (dict(tile_n=192), ValueError, r"tile_n = 192: choose from \(128, 256\)"),
    (dict(stages=1), ValueError, r"stages = 1: the packed ring needs an int >= 2"),
    (dict(splits=0), ValueError, r"splits = 0: choose 1..16"),
    (dict(tile_n=256, stages=8), ValueError, r"needs \d+ B of shared memory"),
    (dict(variant=P0Variant()), TypeError, r"unexpected keyword argument 'variant'"),  # study
    (dict(swizzle=2), TypeError, r"unexpected keyword argument 'swizzle'"),  # never chosen
    (dict(tile_m=256), TypeError, r"unexpected keyword argument 'tile_m'"),  # lost (v2)
    (dict(buffers=4), TypeError, r"unexpected keyword argument 'buffers'"),  # lost (v3)
    (dict(ablate="no_mma"), TypeError, r"unexpected keyword argument 'ablate'"),
], ids=["tile_n", "stages", "splits", "smem", "variant", "swizzle", "tile_m", "buffers",
        "ablate"])
def test_p0_shell_refuses_bad_and_lost_options(kw, exc, match):
    with pytest.raises(exc, match=match) as e:
        BlockscaledGemmSm90(**kw)
    assert e.type is exc


def test_p0_cache_key_tells_modules_and_variants_apart():
    """Same tiles, another producer class (or variant, or split count): another compiled
    kernel. Equal static choices: one kernel."""
    class OtherProducer(TmaPrepackedProducer):
        pass

    base = BlockscaledGemmSm90(tile_n=128, stages=8)
    assert base.static_key() == BlockscaledGemmSm90(tile_n=128, stages=8).static_key()
    others = [BlockscaledGemmSm90(tile_n=128, stages=8, producer=OtherProducer(128, 128, 8)),
              P0Variant(skip_mma=True).of(BlockscaledGemmSm90(tile_n=128, stages=8)),
              BlockscaledGemmSm90(tile_n=128, stages=8, splits=2),
              BlockscaledGemmSm90(tile_n=128, stages=8, raster_along_m=False)]
    keys = {base.static_key(), *(c.static_key() for c in others)}
    assert len(keys) == 1 + len(others)
    # the production variant changes nothing
    assert P0Variant().of(base).static_key() == base.static_key()
    with pytest.raises(ValueError, match=r"producer tile \(128, 256\) differs"):
        BlockscaledGemmSm90(tile_n=128, producer=TmaPrepackedProducer(128, 256, 4))


def test_default_config_matches_the_h200_measurements():
    def pick(M, N, K):
        c = default_config(M, N, K, sms=132)
        return c.tile_n, c.stages, c.splits

    assert pick(128, 5376, 5376) == (128, 8, 3) and pick(128, 5376, 14336) == (128, 8, 3)  # v4
    assert pick(128, 21504, 5376) == (128, 8, 1) and pick(128, 14336, 5376) == (128, 8, 1)
    assert pick(2048, 21504, 5376) == (256, 4, 1) and pick(37810, 5376, 14336) == (256, 4, 1)

    def pick_prepacked(M, N, K):  # v5 (6148474): swap-AB below 4 waves of 128 x 128 tiles
        c = default_config(M, N, K, sms=132, prepacked=True)
        return c.design, c.splits

    assert pick_prepacked(128, 5376, 5376) == ("swap_ab", 3)
    assert pick_prepacked(128, 7168, 5376) == ("swap_ab", 2)
    assert pick_prepacked(128, 21504, 5376) == ("swap_ab", 1)
    assert pick_prepacked(512, 14336, 5376) == ("swap_ab", 1)  # 3.4 waves: won
    assert pick_prepacked(512, 21504, 5376) == ("p0", 1)  # 5.1 waves: lost
    assert pick_prepacked(2048, 5376, 5376) == ("p0", 1)


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


@pytest.mark.gpu
@pytest.mark.parametrize("kinds", [("normal", "normal"), ("lognormal", "normal"), ("raw", "raw"),
                                   ("cancel", "cancel")])
@pytest.mark.parametrize("shape", [(1, 8, 32), (130, 264, 96), (300, 520, 1056),
                                   (256, 1024, 5376)])
@pytest.mark.parametrize("tile_n,stages,splits", [(128, 4, 1), (256, 4, 1), (128, 8, 1),
                                                  (128, 4, 3), (256, 4, 2)])
def test_p0_within_fp32_bound_and_deterministic(kinds, shape, tile_n, stages, splits):
    cfg = BlockscaledGemmSm90(tile_n=tile_n, stages=stages, splits=splits)
    M, N, K = shape
    _within_bound_and_deterministic(kinds, shape, M * 7 + N + K + tile_n + stages, cfg)


@pytest.mark.gpu
def test_p0_row_slices_without_copy():
    M, N, K = 700, 256, 512
    a, b = _operands("normal", "lognormal", M, N, K, seed=11)
    full = gemm_nvfp4(*a, *b)
    for r0, r1 in ((0, 128), (128, 700), (256, 257), (512, 700)):
        part = torch.full((r1 - r0, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        gemm_nvfp4(*a, *b, rows=(r0, r1), out=part)
        assert torch.equal(part.view(torch.int16), full[r0:r1].view(torch.int16)), (r0, r1)


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


def _swap_ab_within_bound(M, N, K, seed, tokens=128, splits=1, kinds=("normal", "lognormal"),
                          cfg=None, **study):
    """Poisoned output, every element within the oracle's bound, a rerun bit-identical, P4's
    fused output bit-identical to the reference order on this design too."""
    cfg = cfg or SwapAbStudy(tokens=tokens, splits=splits, **study).build()
    a, b = _operands(*kinds, M, N, K, seed=seed)
    pre = prepack(b[0], b[1])
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_nvfp4(*a, *b, out=out, config=cfg, prepacked=pre)
    _check(out, a, b, M, N, K)
    again = gemm_nvfp4(*a, *b, config=cfg, prepacked=pre)
    assert torch.equal(out.view(torch.int16), again.view(torch.int16)), "two runs differ"
    gate = torch.randn(N, device="cuda").to(torch.bfloat16)
    res = torch.randn(M, N, device="cuda").to(torch.bfloat16)
    fused = gemm_nvfp4(*a, *b, config=cfg, prepacked=pre, gate=gate, residual=res)
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
                          cfg=BlockscaledGemmSm90.swap_ab(stream_k=True))


@pytest.mark.gpu
@settings(max_examples=10, deadline=None)
@given(M=st.integers(1, 400), n8=st.integers(1, 90), k32=st.integers(1, 40),
       seed=st.integers(0, 2**31 - 1))
def test_swap_ab_stream_k_drawn_shapes(M, n8, k32, seed):
    _swap_ab_within_bound(M, 8 * n8, 32 * k32, seed, kinds=("lognormal", "cancel"),
                          cfg=BlockscaledGemmSm90.swap_ab(stream_k=True))


@pytest.mark.gpu
def test_swap_ab_row_slices_and_refuses_a_missing_prepack():
    cfg = SwapAbStudy(tokens=128).build()
    M, N, K = 700, 256, 512
    a, b = _operands("normal", "lognormal", M, N, K, seed=13)
    pre = prepack(b[0], b[1])
    full = gemm_nvfp4(*a, *b, config=cfg, prepacked=pre)
    for r0, r1 in ((128, 700), (256, 257)):
        part = gemm_nvfp4(*a, *b, rows=(r0, r1), config=cfg, prepacked=pre)
        assert torch.equal(part.view(torch.int16), full[r0:r1].view(torch.int16)), (r0, r1)
    with pytest.raises(TypeError, match=r"pass prepacked= a PrepackedWeights"):
        gemm_nvfp4(*a, *b, config=cfg)
    other = prepack(*_operands("normal", "normal", M, 128, K, seed=1)[1][:2])
    with pytest.raises(ValueError, match=r"prepacked holds a \[128, 512\] weight"):
        gemm_nvfp4(*a, *b, config=cfg, prepacked=other)


_STALL = """
from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90, P0Variant, SwapAbStudy
from kernels.nvfp4.gemm import gemm_nvfp4
from device.waits import synchronize
from validators.gemm_operands import make_operand
a = make_operand("normal", 128, 256, 1, "cuda")
b = make_operand("normal", 256, 256, 2, "cuda")
stall = P0Variant(stall_producer=True)
gemm_nvfp4(*a, *b, config=stall.of(BlockscaledGemmSm90(tile_n=128)))
synchronize()
"""


@pytest.mark.gpu
def test_p0_stalled_barrier_traps_with_a_message_naming_it():
    """A wait that can never complete must end the kernel (not hang) and say which barrier."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", _STALL], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode != 0
    assert "timed out after 2 s waiting on the" in r.stderr and "barrier (stage" in r.stderr, \
        r.stderr[-2000:]


@pytest.mark.compile
@pytest.mark.parametrize("tile_n", [256, 128])
def test_f16_smem_layout_is_the_swizzle_the_dequant_writes(tile_n):
    """dequant_rows writes 16-byte chunk c of row r of buffer b at byte
    (b·rows + r)·128 + (c ^ (r % 8))·16: that is the 128-byte swizzle (S<3,4,3> on byte
    addresses) over rows of 64 f16, stacked by rows then buffers. Pin the layout CuTe builds."""
    seen = []

    @cute.jit
    def layouts():
        for lay in DequantWgmmaConsumer(128, tile_n, stages=4).smem_layouts():
            seen.append(str(lay))

    layouts()
    for rows, text in zip((128, tile_n), seen):
        assert text == (f"S<3,4,3> o 0 o ((8,{rows // 8}),(64,1),(1,{F16_BUFFERS})):"
                        f"((64,512),(1,0),(0,{rows * 64}))"), text
