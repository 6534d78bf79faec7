"""The activation stage of the swap-AB design: the token tile expanded to exact f16 once per
CTA tile and k-block, into wgmma's B layout, by a dedicated warpgroup.

This is the producer contract P1 and P2 fill: "an f16 tile [tokens, 64] in the 128-byte-swizzled
K-major B layout behind ``act_full`` / ``act_empty`` barriers". P0 fills it from the packed ring
(the producer's TMA'd Comfy codes and scales, device.nvfp4.expand_stage_rows: the
E4M3-byte trick, one packed convert and one packed multiply per two elements); P1 will fill it
by quantizing bf16 rows in the GEMM (device.nvfp4.quantize_block16) before the same
expansion.

Role contract (kernels/nvfp4/gemm_shell.py): one warpgroup at 80 registers. Owns ``buffers``
f16 tiles and their barriers: ``act_full[b]`` (4 arrivals: each warp after its stores and a
``fence.proxy.async``), ``act_empty[b]`` (the consumers' 8 warp arrivals after the wgmmas that
read it retired). Waits on the ring's ``full[s]``, arrives on its ``empty[s]`` (4 arrivals;
with the activation multicast to a CTA pair, on both CTAs' ``empty[s]``: 4 + 4 on each, since
either CTA's producer writes its half of the activation into both).
"""
from __future__ import annotations

from device.nvfp4 import expand_stage_rows, word_view
from device.runtime import cute_modules
from device.tiles import k_range, make_scheduler
from device.waits import ring_position, wait_parity

cutlass, cute = cute_modules()
from cutlass import Int32, Uint16  # noqa: E402

TILE_K = 64
ROW_BYTES = TILE_K * 2  # one f16 row of a k-block
WARPS = 4


class ExpandedActivationStage:
    """Static config: ``tokens`` rows a tile (a multiple of 128), ``buffers`` f16 tiles, and the
    CTAs (1 or 2) the producer multicasts the packed activation to."""

    warpgroups, regs = 1, 80

    def __init__(self, tokens: int, buffers: int = 2, multicast: int = 1):
        if tokens % 128 or not 128 <= tokens <= 256:
            raise ValueError(f"tokens = {tokens}: choose 128 or 256")
        if not isinstance(buffers, int) or buffers < 2:
            # one tile cannot be refilled while the consumers still read it (with a wgmma group
            # in flight, use u is released only after u + 1 is issued: a deadlock)
            raise ValueError(f"buffers = {buffers!r}: the activation stage needs >= 2 f16 tiles")
        if multicast not in (1, 2):
            raise ValueError(f"multicast = {multicast!r}: 1 or a CTA pair (2)")
        self.tokens, self.buffers, self.multicast = tokens, buffers, multicast
        self.tile_bytes = tokens * ROW_BYTES

    def barriers(self) -> dict:
        return {"act_full": self.buffers, "act_empty": self.buffers}

    def arrivals(self) -> dict:
        return {"empty": WARPS * self.multicast, "act_full": WARPS}

    def waits(self) -> tuple:
        return ("full", "act_empty")

    def smem_bytes(self) -> int:
        return self.buffers * self.tile_bytes + 1024

    def allocate(self, alloc) -> dict:
        return {"act_f16": alloc.allocate(self.buffers * self.tile_bytes, 1024)}

    @cute.jit
    def run(self, ctx, t: Int32):
        sm = ctx.smem
        q_words = word_view(sm["q_a"].iterator, cute.cosize(sm["q_a"].layout))
        sf_pairs = cute.make_tensor(cute.recast_ptr(sm["s_a"].iterator, dtype=Uint16),
                                    cute.make_layout(cute.cosize(sm["s_a"].layout) // 2))
        f16_words = word_view(sm["act_f16"], self.buffers * self.tile_bytes)
        full, empty = ctx.bars["full"], ctx.bars["empty"]
        act_full, act_empty = ctx.bars["act_full"], ctx.bars["act_empty"]
        mailbox, stages = ctx.mailbox, ctx.shell.stages
        k_per_split, k_tiles = ctx.k_per_split, ctx.k_tiles
        skip = ctx.shell.variant.skip_dequant
        lane = t % 32
        sched = make_scheduler(ctx.sched_params)
        work = sched.initial_work_tile_info()
        count = Int32(0)
        while work.is_valid_tile:
            _, _, split = work.tile_idx
            kb0, kb1 = k_range(k_per_split, k_tiles, split)
            for kt in cutlass.range(kb0, kb1, unroll=1):
                s, ph = ring_position(count, stages)
                b, bph = ring_position(count, self.buffers)
                wait_parity(full + s, ph, 0, s, mailbox)
                wait_parity(act_empty + b, bph ^ 1, 3, b, mailbox)
                if cutlass.const_expr(not skip):
                    expand_stage_rows(t, WARPS * 32, self.tokens, q_words, sf_pairs, f16_words,
                                      s, b)
                # our f16 stores -> wgmma (async proxy); our packed reads -> the next TMA
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.sync_warp()
                if lane == 0:
                    if cutlass.const_expr(self.multicast == 1):
                        cute.arch.mbarrier_arrive(empty + s)
                    else:  # both CTAs' producers write into this stage
                        for r in cutlass.range_constexpr(self.multicast):
                            cute.arch.mbarrier_arrive(empty + s, r)
                    cute.arch.mbarrier_arrive(act_full + b)
                count = count + 1
            sched.advance_to_next_work()
            work = sched.get_current_work()
