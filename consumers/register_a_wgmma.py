"""Register-A WGMMA consumer of the swap-AB design: the weights are wgmma's A operand, converted
in registers from the register-order prepack; the activation's f16 tile is B.

Swap-AB computes D^T = W·a^T: each of the two consumer warpgroups owns one 64-row slab of the
CTA's 128 weight rows (wgmma M) against the stage's ``tokens`` activation rows (wgmma N = 128 or
256, accumulators tokens/2 fp32 a thread). Per k-block and thread: one ``ld.shared.v4`` (its 16
code bytes: 4 k16 steps x 4 registers, kernels/nvfp4/prepack.py) and one ``ld.shared.v2`` (8
scale bytes, shared by the 4 threads of a quad), then per k16 step
:func:`device.nvfp4.dequant_a_fragment` (exact f16, one packed convert and one packed
multiply per two elements) and one ``wgmma.m64nNk16.f32.f16.f16`` with A in registers. The
weights never touch f16 shared memory, and the activation is expanded once per CTA tile (by
:mod:`producers.activation_stage`), not once per warpgroup.

Role contract (kernels/nvfp4/gemm_shell.py): warpgroups 2-3 at 200 registers. Waits on the ring's
``full[s]`` and arrives on its ``empty[s]`` once per warp right after the fragment loads (8
arrivals); waits on ``act_full[b]`` and arrives on ``act_empty[b]`` once per warp when the
wgmmas that read tile b have retired (8 arrivals). Each warpgroup retires its k-block's wgmmas
before converting the next one (the loop rewrites the same A registers, which an in-flight
wgmma still reads: a first build that kept one group in flight computed garbage on the H200);
the two warpgroups interleave, so one converts while the other's wgmmas run.

The accumulator of thread (warp q, groupID g, tig) holds rows 16q + g + 8h (weight rows) and
columns 8j + 2·tig + e (tokens); D pairs adjacent weight rows, which live in lanes g and g ^ 1,
so :meth:`output_pairs` swaps one value per pair with ``shfl.bfly 4``.
"""
from __future__ import annotations

from device.nvfp4 import dequant_a_fragment, word_view
from device.ptx import smem_u32
from device.runtime import cute_modules
from device.tiles import k_range, make_scheduler
from device.waits import ring_position, wait_parity
from device.wgmma import keep_alive, sw128_kmajor_descriptor, wgmma_rs_m64k16

cutlass, cute = cute_modules()
from cutlass import Float16, Float32, Int32, Uint32  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402
from cutlass.utils import hopper_helpers as sm90_utils  # noqa: E402

from epilogues import OutputTile  # noqa: E402
from numerics.nvfp4 import PREPACK_SLAB_ROWS as SLAB_ROWS  # noqa: E402
from numerics.nvfp4 import PREPACK_STEPS as STEPS  # noqa: E402
from producers.register_order import SLAB_CODE_BYTES, SLAB_SCALE_BYTES  # noqa: E402

TILE_K = 64
SW128_ATOM = 1024  # bytes of an 8-row swizzle atom of the f16 B tile


class RegisterAWgmmaConsumer:
    """Static config: ``tokens`` (wgmma N: 128 or 256); the weight tile is two 64-row slabs."""

    TOKENS = (128,)  # 256 needs 128 accumulators a thread: over the 512-thread CTA's 128 registers
    warpgroups, regs = 2, 200

    def __init__(self, tokens: int, overlap: bool = False):
        if tokens not in self.TOKENS:
            raise ValueError(f"tokens = {tokens}: choose from {self.TOKENS}")
        self.tile_m, self.tile_n = tokens, 2 * SLAB_ROWS
        self.threads = 256
        self.overlap = overlap  # under study (SwapAbStudy): one wgmma group in flight

    def barriers(self) -> dict:
        return {}

    def arrivals(self) -> dict:
        return {"empty": self.threads // 32, "act_empty": self.threads // 32}

    def waits(self) -> tuple:
        return ("full", "act_full")

    def smem_bytes(self) -> int:
        return 0

    def allocate(self, alloc) -> dict:
        return {}

    def tiled_mma(self):
        """The RS f16 wgmma as a TiledMma (the shell's kernel signature; the mainloop issues
        the instruction itself, device.wgmma)."""
        k_major = warpgroup.OperandMajorMode.K
        return sm90_utils.make_trivial_tiled_mma(Float16, Float16, k_major, k_major, Float32,
                                                 (1, 1, 1), tiler_mn=(64, self.tile_m),
                                                 a_source=warpgroup.OperandSource.RMEM)

    @cute.jit
    def run(self, ctx, ct: Int32):
        sm = ctx.smem
        stages, variant = ctx.shell.stages, ctx.shell.variant
        buffers = ctx.shell.activation.buffers
        tile_bytes = ctx.shell.activation.tile_bytes
        wg = ct // 128
        t = ct % 128
        lane = t % 32
        codes = word_view(sm["w_codes"].iterator, cute.cosize(sm["w_codes"].layout))
        scales = cute.make_tensor(cute.recast_ptr(sm["w_scales"].iterator, dtype=Uint32),
                                  cute.make_layout(cute.cosize(sm["w_scales"].layout) // 4))
        f16_base = smem_u32(sm["act_f16"])
        full, empty = ctx.bars["full"], ctx.bars["empty"]
        act_full, act_empty = ctx.bars["act_full"], ctx.bars["act_empty"]
        epilogue, epi, mailbox = ctx.shell.epilogue, ctx.epi, ctx.mailbox
        k_per_split, k_tiles = ctx.k_per_split, ctx.k_tiles
        n_tiles = (epi.d.shape[1] * 2 + self.tile_n - 1) // self.tile_n
        acc = cute.make_rmem_tensor((self.tile_m // 2,), Float32)
        a_x = cute.make_rmem_tensor((4 * STEPS,), Uint32)
        a_y = cute.make_rmem_tensor((4 * STEPS,), Uint32)
        sched = make_scheduler(ctx.sched_params)
        work = sched.initial_work_tile_info()
        count = Int32(0)
        while work.is_valid_tile:
            m_idx, n_idx, split = work.tile_idx
            kb0, kb1 = k_range(k_per_split, k_tiles, split)
            acc.fill(0.0)
            if cutlass.const_expr(not self.overlap):
                for kt in cutlass.range(kb0, kb1, unroll=1):
                    self._load_convert(a_x, codes, scales, full, empty, mailbox, stages, count,
                                       wg, t)
                    self._issue(acc, a_x, act_full, mailbox, f16_base, tile_bytes, buffers,
                                count, variant)
                    # retire before the next conversion rewrites the A registers these
                    # wgmmas read; the other warpgroup's wgmmas fill the gap
                    warpgroup.wait_group(0)
                    if lane == 0:
                        cute.arch.mbarrier_arrive(act_empty + count % buffers)
                    count = count + 1
            else:
                # one group in flight: k-blocks alternate between two A register sets, x and
                # y; a set is read once more (keep_alive) after the wait that retires its
                # wgmmas, so it cannot be reassigned while they may still read it
                n = kb1 - kb0
                if n > 0:  # a K split past the end has no k-block (its partial is 0)
                    self._load_convert(a_x, codes, scales, full, empty, mailbox, stages, count,
                                       wg, t)
                    for p in cutlass.range((n + 1) // 2, unroll=1):
                        i = 2 * p
                        self._issue(acc, a_x, act_full, mailbox, f16_base, tile_bytes, buffers,
                                    count + i, variant)
                        warpgroup.wait_group(1)
                        if i > 0:
                            self._retire(a_y, act_empty, buffers, count + i - 1, lane, k_tiles,
                                         mailbox)
                        if i + 1 < n:
                            self._load_convert(a_y, codes, scales, full, empty, mailbox, stages,
                                               count + i + 1, wg, t)
                            self._issue(acc, a_y, act_full, mailbox, f16_base, tile_bytes,
                                        buffers, count + i + 1, variant)
                            warpgroup.wait_group(1)
                            self._retire(a_x, act_empty, buffers, count + i, lane, k_tiles,
                                         mailbox)
                            if i + 2 < n:
                                self._load_convert(a_x, codes, scales, full, empty, mailbox,
                                                   stages, count + i + 2, wg, t)
                    warpgroup.wait_group(0)
                    if lane == 0:
                        cute.arch.mbarrier_arrive(act_empty + (count + n - 1) % buffers)
                    count = count + n
            epilogue.store(self.output_pairs(acc, wg, t), epi,
                           OutputTile(m0=m_idx * self.tile_m, n0=n_idx * self.tile_n,
                                      tile_id=m_idx * n_tiles + n_idx, split=split, ct=ct))
            sched.advance_to_next_work()
            work = sched.get_current_work()

    @cute.jit
    def _load_convert(self, a: cute.Tensor, codes: cute.Tensor, scales: cute.Tensor, full,
                      empty, mailbox: cute.Tensor, stages: cutlass.Constexpr[int], cnt: Int32,
                      wg: Int32, t: Int32):
        """Wait for ring use ``cnt``, load this thread's weight fragments of it (16 code bytes,
        8 scale bytes), release the stage and convert them into ``a`` (4 k16 steps x 4 f16x2
        registers)."""
        s, ph = ring_position(cnt, stages)
        wait_parity(full + s, ph, 0, s, mailbox)
        slot = s * 2 + wg
        frag = cute.make_rmem_tensor((4,), Uint32)
        cute.autovec_copy(codes[(None, slot * (SLAB_CODE_BYTES // 16) + t)], frag)
        sc = cute.make_rmem_tensor((2,), Uint32)
        base = slot * (SLAB_SCALE_BYTES // 4) + (t // 4) * 2
        sc[0] = scales[base]
        sc[1] = scales[base + 1]
        cute.arch.sync_warp()
        if t % 32 == 0:
            cute.arch.mbarrier_arrive(empty + s)
        for st in cutlass.range_constexpr(STEPS):
            pair = sc[st // 2] if st % 2 == 0 else sc[st // 2] >> Uint32(16)
            words = dequant_a_fragment(frag[st], pair)
            for j in cutlass.range_constexpr(4):
                a[4 * st + j] = words[j]

    @cute.jit
    def _issue(self, acc: cute.Tensor, a: cute.Tensor, act_full, mailbox: cute.Tensor,
               f16_base: Int32, tile_bytes: cutlass.Constexpr[int],
               buffers: cutlass.Constexpr[int], cnt: Int32, variant):
        """Wait for the activation tile of use ``cnt`` and issue its 4 k16 wgmmas on ``a`` as
        one commit group."""
        b, bph = ring_position(cnt, buffers)
        wait_parity(act_full + b, bph, 2, b, mailbox)
        if cutlass.const_expr(not variant.skip_mma):
            warpgroup.fence()
            tile_addr = f16_base + b * tile_bytes
            for st in cutlass.range_constexpr(STEPS):
                desc = sw128_kmajor_descriptor(tile_addr + st * 32, SW128_ATOM)
                res = wgmma_rs_m64k16([acc[i] for i in range(self.tile_m // 2)],
                                      [a[4 * st + j] for j in range(4)], desc, "f16")
                for i in cutlass.range_constexpr(self.tile_m // 2):
                    acc[i] = res[i]
            warpgroup.commit_group()

    @cute.jit
    def _retire(self, a: cute.Tensor, act_empty, buffers: cutlass.Constexpr[int], cnt: Int32,
                lane: Int32, never: Int32, mailbox: cute.Tensor):
        """After the wait that retired use ``cnt``'s wgmmas: release its activation tile and
        read its A registers once more (device.wgmma.keep_alive)."""
        if lane == 0:
            cute.arch.mbarrier_arrive(act_empty + cnt % buffers)
        keep_alive([a[i] for i in range(4 * STEPS)], never, mailbox.iterator)

    def output_pairs(self, acc, wg, t):
        """[(m, n, x0, x1)] in D tile coordinates (m a token, n an even weight row of the
        CTA's 128): lanes g and g ^ 1 swap one value of each accumulator pair."""
        q, lane = t // 32, t % 32
        g, tig = lane // 4, lane % 4
        odd = g & 1
        is_odd = odd == 1
        out = []
        for j in range(self.tile_m // 8):
            for h in range(2):
                x0, x1 = acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]
                recv = cute.arch.shuffle_sync_bfly(cutlass.select_(is_odd, x0, x1), offset=4)
                m = 8 * j + 2 * tig + odd
                n = wg * SLAB_ROWS + 16 * q + (g - odd) + 8 * h
                out.append((m, n, cutlass.select_(is_odd, recv, x0),
                            cutlass.select_(is_odd, x1, recv)))
        return out
