"""Register-A WGMMA consumer of the swap-AB design: the weights are wgmma's A operand, converted
in registers from the register-order prepack; the activation's f16 tile is B.

Swap-AB computes D^T = W·a^T: each of the two consumer warpgroups owns one 64-row slab of the
CTA's 128 weight rows (wgmma M) against the stage's ``tokens`` = 128 activation rows (wgmma N;
64 fp32 accumulators a thread). Per k-block and thread: one ``ld.shared.v4`` (its 16
code bytes: 4 k16 steps x 4 registers, kernels/nvfp4/prepack.py) and one ``ld.shared.v2`` (8
scale bytes, shared by the 4 threads of a quad), then per k16 step
:func:`device.nvfp4.dequant_a_fragment` (exact f16, one packed convert and one packed
multiply per two elements) and one ``wgmma.m64n128k16.f32.f16.f16`` with A in registers. The
weights never touch f16 shared memory, and the activation is expanded once per CTA tile (by
:mod:`producers.activation_stage`), not once per warpgroup.

Role contract (kernels/nvfp4/gemm_shell.py): warpgroups 2-3 at 200 registers. Reads the
producer's ring of ``stages`` stages: waits on its ``full[s]`` and arrives on its ``empty[s]``
once per warp right after the fragment loads (8 arrivals); reads the activation stage's f16
tiles (``act_tiles``): waits on ``act_full[b]`` and arrives on ``act_empty[b]`` once per warp
when the wgmmas that read tile b have retired (8 arrivals). Its 256 threads (``threads``) call
the epilogue after each tile. Each warpgroup retires its k-block's wgmmas before converting the
next one (the loop rewrites the same A registers, which an in-flight wgmma still reads: a first
build that kept one group in flight computed garbage on the H200); the two warpgroups
interleave, so one converts while the other's wgmmas run. A study that kept one group in
flight over two A register sets (v5) measured within 2 % and was correct only by ptxas's
scheduling; it left the code (notes/p0-gemm.md v5).

The accumulator of thread (warp q, groupID g, tig) holds rows 16q + g + 8h (weight rows) and
columns 8j + 2·tig + e (tokens); D pairs adjacent weight rows, which live in lanes g and g ^ 1,
so :meth:`output_pairs` swaps one value per pair with ``shfl.bfly 4``.
"""
from __future__ import annotations

from typing import NamedTuple

from configs.arch import WARP, WARPGROUP
from device.barriers import Barrier
from device.nvfp4 import dequant_a_fragment, word_view
from device.ptx import fence_proxy_async_global, red_release_gpu_add, smem_u32
from device.runtime import cute_modules
from device.tiles import for_each_tile
from device.waits import ring_position, wait_parity
from device.wgmma import sw128_kmajor_descriptor, wgmma_rs_m64k16
from epilogues import OutputTile
from numerics.nvfp4 import PREPACK_SLAB_ROWS as SLAB_ROWS
from numerics.nvfp4 import PREPACK_STEPS as STEPS
from producers.activation_stage import F16Tiles
from producers.register_order import SLAB_CODE_BYTES, SLAB_SCALE_BYTES
from producers.ring_queue import QueueLayout, done_slot

cutlass, cute = cute_modules()
from cutlass import Float16, Float32, Int32, Uint32  # noqa: E402
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup  # noqa: E402
from cutlass.utils import hopper_helpers as sm90_utils  # noqa: E402

SW128_ATOM = 1024  # bytes of an 8-row swizzle atom of the f16 B tile


class TileViews(NamedTuple):
    """What a consumer thread's tile loop reads, built once before it."""
    acc: object  # fp32 accumulators (tokens / 2)
    a_x: object  # A registers (4 k16 steps x 4 f16x2)
    a_y: object  # a second A register set (the N-group reuse's second slab pair)
    codes: object  # the ring's weight codes, as 16-byte words
    scales: object  # the ring's weight scales, as 32-bit words
    f16_base: object  # shared address of the activation's f16 tiles
    full: object
    empty: object
    act_full: object
    act_empty: object
    epilogue: object
    epi: object
    mailbox: object
    k_tiles: object
    n_tiles: object  # weight tiles along N
    ct: object  # consumer thread 0..255
    wg: object  # its warpgroup
    t: object  # its thread in the warpgroup
    lane: object


class RegisterAWgmmaConsumer:
    """Static config: ``tokens`` (wgmma N, from TOKENS), the producer's ring depth ``stages``
    and the activation stage's f16 tiles ``act_tiles``; the weight tile is two 64-row slabs.
    ``mma``: off only in the measurement build that times the rest without the wgmmas
    (kernels.nvfp4.gemm_shell.P0Variant). ``act_peers``: the CTAs of a cluster whose one
    writer of each f16 tile fills it for all (P1's clusters); each tile is then freed on its
    writer's ``act_empty`` (which counts the consumer warps of all of them)."""

    # 256 tokens hold 128 accumulators a thread: 232 registers, which the 512-thread CTA's
    # register file allows only beside 24-register producer and activation roles (the f16
    # activation by TMA, V3Study(activation="f16_tma"); the shell checks the sum)
    TOKENS = (128, 256)
    REGS = {128: 200, 256: 232}
    warpgroups, regs = 2, 200
    mma = True

    def __init__(self, tokens: int, stages: int, act_tiles: F16Tiles, act_peers: int = 1):
        if tokens not in self.TOKENS:
            raise ValueError(f"tokens = {tokens}: choose from {self.TOKENS}")
        self.act_peers = act_peers
        self.regs = self.REGS[tokens]
        # what ptxas must be allowed for the whole kernel (its cap is 65536 / the CTA's
        # threads): 256 tokens' 128 accumulators, 16 A registers and the addresses need > 128
        self.compile_regs = 160 if tokens == 256 else 0
        self.tile_m, self.tile_n = tokens, 2 * SLAB_ROWS
        self.stages, self.act_tiles = stages, act_tiles
        self.threads = self.warpgroups * WARPGROUP

    def barriers(self) -> dict:
        return {}

    def arrivals(self) -> dict:
        return {"empty": self.threads // WARP,
                "act_empty": self.threads // WARP * self.act_peers}

    def waits(self) -> tuple:
        return ("full", "act_full")

    def named_barriers(self) -> dict:
        return {}

    def smem_bytes(self) -> int:
        return 0

    def allocate(self, alloc) -> dict:
        return {}

    def tiled_mma(self):
        """The RS f16 wgmma as a TiledMma (the shell's kernel signature; the mainloop issues
        the instruction itself, device.wgmma)."""
        k_major = OperandMajorMode.K
        return sm90_utils.make_trivial_tiled_mma(Float16, Float16, k_major, k_major, Float32,
                                                 (1, 1, 1), tiler_mn=(64, self.tile_m),
                                                 a_source=warpgroup.OperandSource.RMEM)

    @cute.jit
    def run(self, ctx, ct: Int32):
        sm = ctx.smem
        wg = ct // WARPGROUP
        t = ct % WARPGROUP
        lane = t % WARP
        codes = word_view(sm["w_codes"].iterator, cute.cosize(sm["w_codes"].layout))
        scales = cute.make_tensor(cute.recast_ptr(sm["w_scales"].iterator, dtype=Uint32),
                                  cute.make_layout(cute.cosize(sm["w_scales"].layout) // 4))
        f16_base = smem_u32(sm["act_f16"])
        n_tiles = (ctx.epi.d.shape[1] * 2 + self.tile_n - 1) // self.tile_n
        acc = cute.make_rmem_tensor((self.tile_m // 2,), Float32)
        a_x = cute.make_rmem_tensor((4 * STEPS,), Uint32)
        a_y = cute.make_rmem_tensor((4 * STEPS,), Uint32)
        for_each_tile(ctx.tiles, self.consume_tile,
                      TileViews(acc, a_x, a_y, codes, scales, f16_base, ctx.bars["full"],
                                ctx.bars["empty"], ctx.bars["act_full"], ctx.bars["act_empty"],
                                ctx.epilogue, ctx.epi, ctx.mailbox, ctx.tiles.k_tiles, n_tiles,
                                ct, wg, t, lane))

    @cute.jit
    def consume_tile(self, tile, v: TileViews, count: Int32) -> Int32:
        """The tile's k-blocks (:meth:`mainloop`), then the epilogue."""
        v.acc.fill(0.0)
        count = self.mainloop(tile, v, count)
        self.store_tile(tile, v)
        return count

    @cute.jit
    def store_tile(self, tile, v: TileViews):
        """The epilogue on the tile's accumulators."""
        v.epilogue.store(self.output_pairs(v.acc, v.wg, v.t), v.epi,
                         OutputTile(m0=tile.m * self.tile_m, n0=tile.n * self.tile_n,
                                    tile_id=tile.m * v.n_tiles + tile.n, split=tile.split,
                                    ct=v.ct, segments=tile.segments))

    @cute.jit
    def mainloop(self, tile, v: TileViews, count: Int32) -> Int32:
        """Per k-block: load and convert the weight fragments, issue the wgmmas on the
        activation tile and retire them before the next conversion rewrites the A registers
        (the other warpgroup's wgmmas fill the gap); release the tile."""
        for kt in cutlass.range(tile.k0, tile.k1, unroll=1):
            self._load_convert(v.a_x, v, count)
            self._issue(v.a_x, v, count)
            warpgroup.wait_group(0)
            if v.lane == 0:
                self._release_act(v, count % self.act_tiles.buffers)
            count = count + 1
        return count

    @cute.jit
    def _release_act(self, v: TileViews, b: Int32):
        """Free f16 tile ``b`` for whoever writes it: this CTA's activation stage, or with
        ``act_peers`` > 1 its owner in the cluster."""
        # remote arrives at the default CTA scope, as CUTLASS's multicast consumers: the
        # writer refills through the async proxy (TMA, bulk copies) after its wait, and a
        # cluster-scope release costs ~0.5-1 µs a k-block on this path (notes/p1.md, session 26)
        if cutlass.const_expr(self.act_peers == 1):
            cute.arch.mbarrier_arrive(v.act_empty + b)
        else:  # b's one writer: rank b mod C
            cute.arch.mbarrier_arrive(v.act_empty + b, b % self.act_peers)

    @cute.jit
    def _load_convert(self, a: cute.Tensor, v: TileViews, cnt: Int32):
        """Wait for ring use ``cnt``, load this thread's weight fragments of it (16 code bytes,
        8 scale bytes), release the stage and convert them into ``a`` (4 k16 steps x 4 f16x2
        registers)."""
        frag = cute.make_rmem_tensor((4,), Uint32)
        sc = cute.make_rmem_tensor((2,), Uint32)
        self._load_fragments(frag, sc, v, cnt)
        for st in cutlass.range_constexpr(STEPS):
            self._convert_slot(a, frag, sc, st)

    @cute.jit
    def _load_fragments(self, frag: cute.Tensor, sc: cute.Tensor, v: TileViews, cnt: Int32):
        """Wait for ring use ``cnt``, load this thread's 16 code bytes and 8 scale bytes of it
        into ``frag`` and ``sc`` and release the stage."""
        s, ph = ring_position(cnt, self.stages)
        wait_parity(v.full + s, ph, Barrier.FULL, s, v.mailbox)
        slot = s * 2 + v.wg
        cute.autovec_copy(v.codes[(None, slot * (SLAB_CODE_BYTES // 16) + v.t)], frag)
        base = slot * (SLAB_SCALE_BYTES // 4) + (v.t // 4) * 2
        sc[0] = v.scales[base]
        sc[1] = v.scales[base + 1]
        cute.arch.sync_warp()
        if v.t % 32 == 0:
            cute.arch.mbarrier_arrive(v.empty + s)

    @cute.jit
    def _convert_slot(self, a: cute.Tensor, frag: cute.Tensor, sc: cute.Tensor,
                      st: cutlass.Constexpr):
        """A slot ``st`` (4 f16x2 registers) from k16 step st's code word and scale pair."""
        pair = sc[st // 2] if st % 2 == 0 else sc[st // 2] >> Uint32(16)
        words = dequant_a_fragment(frag[st], pair)
        for j in cutlass.range_constexpr(4):
            a[4 * st + j] = words[j]

    @cute.jit
    def _issue(self, a: cute.Tensor, v: TileViews, cnt: Int32):
        """Wait for the activation tile of use ``cnt`` and issue its 4 k16 wgmmas on ``a`` as
        one commit group."""
        acc = v.acc
        b, bph = ring_position(cnt, self.act_tiles.buffers)
        wait_parity(v.act_full + b, bph, Barrier.ACT_FULL, b, v.mailbox)
        if cutlass.const_expr(self.mma):
            warpgroup.fence()
            tile_addr = v.f16_base + b * self.act_tiles.tile_bytes
            for st in cutlass.range_constexpr(STEPS):
                self._wgmma_k16(acc, a, tile_addr, st)
            warpgroup.commit_group()

    @cute.jit
    def _wgmma_k16(self, acc: cute.Tensor, a: cute.Tensor, tile_addr, st: cutlass.Constexpr):
        """acc += A slot ``st`` (4 registers of ``a``) x the f16 tile's k16 step ``st``: one
        m64 x tile_m x k16 register-sourced wgmma (not committed here)."""
        desc = sw128_kmajor_descriptor(tile_addr + st * 32, SW128_ATOM)
        res = wgmma_rs_m64k16([acc[i] for i in range(self.tile_m // 2)],
                              [a[4 * st + j] for j in range(4)], desc, "f16")
        for i in cutlass.range_constexpr(self.tile_m // 2):
            acc[i] = res[i]

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


class PeerFedRegisterAWgmmaConsumer(RegisterAWgmmaConsumer):
    """Study (kernels.nvfp4.gemm_shell.P1Study(cluster=C)): the production consumer for f16
    tiles that one CTA of a cluster of ``peers`` fills and sends to the others
    (producers.activation_stage.ClusterSharedTiles): waits on its own ``act_full`` (the bytes
    complete it) and frees each tile on its owner's ``act_empty[b]`` alone (rank b mod C, the
    buffer's one writer; one remote arrive a warp). ``act_empty``: 8 x C arrivals."""

    def __init__(self, tokens: int, stages: int, act_tiles: F16Tiles, peers: int = 2):
        super().__init__(tokens, stages, act_tiles, act_peers=peers)


class GroupedRegisterAWgmmaConsumer(RegisterAWgmmaConsumer):
    """Study (kernels.nvfp4.gemm_shell.P1Study(groups=2, tokens=64); notes/p1.md, "N-group
    reuse"): P1's N-group reuse G = 2. Each activation tile (``tokens`` = 64 rows, so that two
    accumulator sets fit ptxas's 128-register cap of a 512-thread CTA) feeds two weight tiles:
    the CTA's weight tile is four 64-row slabs, consumer warpgroup wg owning slabs wg and
    wg + 2 with one accumulator set each (2 x tokens / 2 fp32 a thread). Per k-block: one wait
    on ``full[s]``, both slabs' fragments loaded and converted (A sets ``a_x`` and ``a_y``), one
    arrival on ``empty[s]``; one wait on ``act_full``, then per k16 step a wgmma for each slab on
    the same f16 B tile, one commit group, retired before the next k-block's conversion
    rewrites the A sets. Barriers and arrival counts are the parent's."""

    TOKENS = (64,)
    REGS = {64: 200}
    groups = 2  # the A sets a_x and a_y: one a group

    def __init__(self, tokens: int, stages: int, act_tiles: F16Tiles):
        super().__init__(tokens, stages, act_tiles)
        self.tile_n = 2 * self.groups * SLAB_ROWS

    @cute.jit
    def run(self, ctx, ct: Int32):
        sm = ctx.smem
        wg = ct // WARPGROUP
        t = ct % WARPGROUP
        codes = word_view(sm["w_codes"].iterator, cute.cosize(sm["w_codes"].layout))
        scales = cute.make_tensor(cute.recast_ptr(sm["w_scales"].iterator, dtype=Uint32),
                                  cute.make_layout(cute.cosize(sm["w_scales"].layout) // 4))
        n_tiles = (ctx.epi.d.shape[1] * 2 + self.tile_n - 1) // self.tile_n
        acc = cute.make_rmem_tensor((self.groups * self.tile_m // 2,), Float32)
        a_x = cute.make_rmem_tensor((4 * STEPS,), Uint32)
        a_y = cute.make_rmem_tensor((4 * STEPS,), Uint32)
        for_each_tile(ctx.tiles, self.consume_tile,
                      TileViews(acc, a_x, a_y, codes, scales, smem_u32(sm["act_f16"]),
                                ctx.bars["full"], ctx.bars["empty"], ctx.bars["act_full"],
                                ctx.bars["act_empty"], ctx.epilogue, ctx.epi, ctx.mailbox,
                                ctx.tiles.k_tiles, n_tiles, ct, wg, t, t % WARP))

    @cute.jit
    def mainloop(self, tile, v: TileViews, count: Int32) -> Int32:
        for kt in cutlass.range(tile.k0, tile.k1, unroll=1):
            s, ph = ring_position(count, self.stages)
            wait_parity(v.full + s, ph, Barrier.FULL, s, v.mailbox)
            frags = [cute.make_rmem_tensor((4,), Uint32) for _ in range(self.groups)]
            scs = [cute.make_rmem_tensor((2,), Uint32) for _ in range(self.groups)]
            for g in cutlass.range_constexpr(self.groups):  # both slabs' fragments, then free
                slot = s * (2 * self.groups) + v.wg + 2 * g  # the stage for the producer
                cute.autovec_copy(v.codes[(None, slot * (SLAB_CODE_BYTES // 16) + v.t)],
                                  frags[g])
                base = slot * (SLAB_SCALE_BYTES // 4) + (v.t // 4) * 2
                scs[g][0] = v.scales[base]
                scs[g][1] = v.scales[base + 1]
            cute.arch.sync_warp()
            if v.t % 32 == 0:
                cute.arch.mbarrier_arrive(v.empty + s)
            for g, a in ((0, v.a_x), (1, v.a_y)):
                for st in cutlass.range_constexpr(STEPS):
                    self._convert_slot(a, frags[g], scs[g], st)
            b, bph = ring_position(count, self.act_tiles.buffers)
            wait_parity(v.act_full + b, bph, Barrier.ACT_FULL, b, v.mailbox)
            if cutlass.const_expr(self.mma):
                warpgroup.fence()
                tile_addr = v.f16_base + b * self.act_tiles.tile_bytes
                for st in cutlass.range_constexpr(STEPS):
                    for g, a in ((0, v.a_x), (1, v.a_y)):
                        self._wgmma_group(v.acc, g, a, tile_addr, st)
                warpgroup.commit_group()
            warpgroup.wait_group(0)
            if v.lane == 0:
                self._release_act(v, b)
            count = count + 1
        return count

    @cute.jit
    def _wgmma_group(self, acc: cute.Tensor, g: cutlass.Constexpr, a: cute.Tensor, tile_addr,
                     st: cutlass.Constexpr):
        """Accumulator set ``g`` += A slot ``st`` of ``a`` x the f16 tile's k16 step ``st``."""
        n = self.tile_m // 2
        desc = sw128_kmajor_descriptor(tile_addr + st * 32, SW128_ATOM)
        res = wgmma_rs_m64k16([acc[g * n + i] for i in range(n)],
                              [a[4 * st + j] for j in range(4)], desc, "f16")
        for i in cutlass.range_constexpr(n):
            acc[g * n + i] = res[i]

    def output_pairs(self, acc, wg, t):
        """The parent's pairs for each accumulator set, set g's weight rows 128 further on
        (slab wg + 2g)."""
        n = self.tile_m // 2
        out = []
        for g in range(self.groups):
            part = [acc[g * n + i] for i in range(n)]
            out += [(m, c + 2 * g * SLAB_ROWS, x0, x1)
                    for m, c, x0, x1 in RegisterAWgmmaConsumer.output_pairs(self, part, wg, t)]
        return out


class PipelinedRegisterAWgmmaConsumer(RegisterAWgmmaConsumer):
    """Study (kernels.nvfp4.gemm_shell.V3Study(consumer="pipelined"); notes/p0-gemm.md,
    "The pipelined register-A consumer"): the public register-A order (quack's
    ``mma_rs_interleaved``, CUTLASS's sm90 RS mainloop), two k16 wgmmas in flight across every
    k-block boundary and no ``wait_group(0)`` inside a tile.

    Per k16 step st of a k-block: convert A slot st + 1 (at st = 3: load the next k-block's
    fragments and convert its slot 0), then fence, wgmma(st) on slot st, commit, and
    ``wgmma.wait_group(2)``. A slot is rewritten only after the wait that retired the wgmma
    that last read it (slot st + 1 was read three groups back; slot 0 at st = 3 by this
    k-block's step 0, two back), so no register an in-flight wgmma reads is redefined and
    ptxas has no reason to serialise the wgmmas (its C7513). The activation tile of k-block j
    is released at step 1 of k-block j + 1 (its last wgmma has retired), and at the tile's end
    after ``wait_group(0)``. No keep-alive reads: the per-k16 study that had them (removed at
    8438956) was 1.4-1.6x slower than the serial consumer.

    Role contract as :class:`RegisterAWgmmaConsumer`'s (warpgroups 2-3, 200 registers, 8
    arrivals each on ``empty`` and ``act_empty``); it holds an activation tile one k16 step
    longer, so give the activation stage more than two buffers."""

    IN_FLIGHT = 2

    @cute.jit
    def mainloop(self, tile, v: TileViews, count: Int32) -> Int32:
        a, acc = v.a_x, v.acc  # (an assignment through v would make v loop-carried)
        frag = cute.make_rmem_tensor((4,), Uint32)
        sc = cute.make_rmem_tensor((2,), Uint32)
        if tile.k1 > tile.k0:  # a K split past the end has no k-block
            self._load_fragments(frag, sc, v, count)
            self._convert_slot(a, frag, sc, 0)
        for kt in cutlass.range(tile.k0, tile.k1, unroll=1):
            b, bph = ring_position(count, self.act_tiles.buffers)
            wait_parity(v.act_full + b, bph, Barrier.ACT_FULL, b, v.mailbox)
            tile_addr = v.f16_base + b * self.act_tiles.tile_bytes
            for st in cutlass.range_constexpr(STEPS):
                if cutlass.const_expr(st + 1 < STEPS):
                    self._convert_slot(a, frag, sc, st + 1)
                else:
                    if kt + 1 < tile.k1:
                        self._load_fragments(frag, sc, v, count + 1)
                        self._convert_slot(a, frag, sc, 0)
                if cutlass.const_expr(self.mma):
                    warpgroup.fence()
                    self._wgmma_k16(acc, a, tile_addr, st)
                    warpgroup.commit_group()
                    warpgroup.wait_group(self.IN_FLIGHT)
                if cutlass.const_expr(st == 1):
                    # the previous k-block's last wgmma has retired: its tile is free
                    if kt > tile.k0 and v.lane == 0:
                        self._release_act(v, (count - 1) % self.act_tiles.buffers)
            count = count + 1
        warpgroup.wait_group(0)
        if tile.k1 > tile.k0 and v.lane == 0:
            self._release_act(v, (count - 1) % self.act_tiles.buffers)
        return count


class RingReleasingConsumer(PipelinedRegisterAWgmmaConsumer):
    """:class:`PipelinedRegisterAWgmmaConsumer` of the work queue (producers.ring_queue): after
    a tile's mainloop (every k-block of its ring rows has landed in shared memory, so the TMA's
    reads of the slot are complete) consumer thread 0 counts the tile into its chunk's
    ``done`` (``red.release.gpu``), which frees the slot for the quantizers once every tile of
    the chunk is counted; then the epilogue as before."""

    def __init__(self, tokens: int, stages: int, act_tiles: F16Tiles, layout: QueueLayout):
        super().__init__(tokens, stages, act_tiles)
        self.layout = layout

    @cute.jit
    def consume_tile(self, tile, v: TileViews, count: Int32) -> Int32:
        v.acc.fill(0.0)
        count = self.mainloop(tile, v, count)
        if v.ct == 0:
            fence_proxy_async_global()  # the TMA's reads of the slot (seen complete) first
            chunks = self.layout.chunks(cute.size(v.epi.d, mode=[0]))
            red_release_gpu_add(
                v.epi.count.iterator + done_slot(tile.m // self.layout.chunk_tiles, chunks),
                Int32(1))
        self.store_tile(tile, v)
        return count
