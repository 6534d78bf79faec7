"""The activation stages of the swap-AB designs: what fills the consumer's f16 tiles, one
k-block of every token row in wgmma's B layout.

This is the producer contract P0, P1 and P2 fill: "an f16 tile [tokens, 64] in the
128-byte-swizzled K-major B layout behind ``act_full`` / ``act_empty`` barriers". P0 fills it
by TMA from the activation's exact f16 expansion (:class:`F16TmaActivationStage`,
:class:`WeightsAndF16Producer`); P1 by quantizing the bf16 rows in the GEMM
(device.nvfp4.quantize_block16) and expanding them (:class:`QuantizingActivationStage`); P2's
work queue from its f16 ring (producers/ring_queue.py). (The stage that expanded the packed
activation in every CTA, and its multicast to CTA pairs, v6, lost and left the code:
notes/p0-gemm.md, v6 and session 27.)
"""
from __future__ import annotations

from typing import NamedTuple

from configs.arch import K_BLOCK, WARP
from device.barriers import Barrier
from device.nvfp4 import ROW_CHUNKS, quantize_expand_stage_rows, word_view
from device.ptx import arrive_expect_tx_cluster, bulk_copy_s2peer, rcp_approx_ftz
from device.runtime import cute_modules
from device.tiles import for_each_tile
from device.waits import acquire_stage, ring_position, wait_parity
from producers.register_order import WeightsOnlyRegisterOrderProducer, f16_box_layout

cutlass, cute = cute_modules()
from cutlass import Float16, Int32, Uint32  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402

ROW_BYTES = K_BLOCK * 2  # one f16 row of a k-block
WARPS = 4


class F16Tiles(NamedTuple):
    """The activation stage's f16 tiles as their reader sees them: ``buffers`` tiles of
    ``tile_bytes`` (one k-block of every token row, wgmma's 128-byte-swizzled K-major B)."""
    buffers: int
    tile_bytes: int


class F16TmaActivationStage:
    """Study (kernels.nvfp4.gemm_shell.V3Study(activation="f16_tma"); notes/p0-gemm.md, P0 v3
    measurement 1(c); production since session 22 in BlockscaledGemmSm90.swap_ab_f16): the
    activation arrives already expanded to exact f16 (e2m1 · scale, as
    kernels.nvfp4.quantize.quantize_expand_nvfp4 or expand_nvfp4 writes it), by TMA straight
    into the f16 tiles, so the CTA does no activation expansion.

    Role contract: one warpgroup at 24 registers (the CTA keeps its 512 threads, so the
    consumers' register budget is the production one); its warp 0 works. Owns ``buffers`` f16
    tiles (:class:`F16Tiles`) and their barriers: ``act_full[b]`` (1 arrive + the tile's bytes,
    TMA), ``act_empty[b]`` (the consumers' 8 warp arrivals). Reads nothing of the packed ring
    (``stages`` is the producer's, which the shell checks); the TMA atom is the producer's
    (producers.register_order.WeightsOnlyRegisterOrderProducer, ``ctx.tma[0]``)."""

    warpgroups, regs = 1, 24

    def __init__(self, tokens: int, stages: int, buffers: int = 2):
        if tokens not in (128, 256):
            raise ValueError(f"tokens = {tokens}: the study TMAs 128- or 256-row tiles (a TMA "
                             "box has at most 256 rows)")
        if not isinstance(buffers, int) or buffers < 2:
            raise ValueError(f"buffers = {buffers!r}: the consumers release a tile one k-block "
                             "late, so >= 2 f16 tiles")
        self.tokens, self.stages = tokens, stages
        self.tiles = F16Tiles(buffers, tokens * ROW_BYTES)

    def barriers(self) -> dict:
        return {"act_full": self.tiles.buffers, "act_empty": self.tiles.buffers}

    def arrivals(self) -> dict:
        return {"act_full": 1}

    def waits(self) -> tuple:
        return ("act_empty",)

    def smem_bytes(self) -> int:
        return self.tiles.buffers * self.tiles.tile_bytes + 1024

    def allocate(self, alloc) -> dict:
        raw = alloc.allocate(self.tiles.buffers * self.tiles.tile_bytes, 1024)
        staged = cute.append(f16_box_layout(self.tokens),
                             cute.make_layout(self.tiles.buffers, stride=self.tokens * K_BLOCK))
        return {"act_f16": raw,
                "act_f16_tma": cute.make_tensor(cute.recast_ptr(raw, dtype=Float16), staged)}

    @cute.jit
    def run(self, ctx, t: Int32):
        if t // WARP == 0:
            atom, tensor = ctx.tma[0]
            tiles = cute.local_tile(tensor, (self.tokens, K_BLOCK), (None, None))
            ts, tg = cpasync.tma_partition(atom, 0, cute.make_layout(1),
                                           cute.group_modes(ctx.smem["act_f16_tma"], 0, 2),
                                           cute.group_modes(tiles, 0, 2))
            for_each_tile(ctx.tiles, self.fill_tile,
                          ((atom, tg, ts), ctx.bars["act_full"], ctx.bars["act_empty"],
                           ctx.mailbox, *self.fill_args(ctx)))

    def fill_args(self, ctx) -> tuple:
        """What :meth:`fill_tile` reads besides the TMA views, barriers and mailbox (none
        here; the work queue's stage adds its counters)."""
        return ()

    @cute.jit
    def fill_tile(self, tile, args, count: Int32) -> Int32:
        """Per k-block of ``tile``: wait for a free f16 tile, announce its bytes and TMA the
        token tile's k-block into it."""
        return self.load_rows(tile.m, tile, args, count)

    @cute.jit
    def load_rows(self, row_tile: Int32, tile, args, count: Int32) -> Int32:
        """``tile``'s k-blocks from token tile ``row_tile`` of the TMA's tensor (the tile's own
        row tile, or its ring slot's in the work queue: producers.ring_queue)."""
        (atom, tg, ts), act_full, act_empty, mailbox = args[:4]
        for kt in cutlass.range(tile.k0, tile.k1, unroll=1):
            b, bar = acquire_stage(count, self.tiles.buffers, act_empty, act_full,
                                   self.tiles.tile_bytes, Barrier.ACT_EMPTY, mailbox)
            cute.copy(atom, tg[(None, row_tile, kt)], ts[(None, b)], tma_bar_ptr=bar)
            count = count + 1
        return count


class WeightsAndF16Producer:
    """Study (kernels.nvfp4.gemm_shell.V3Study(activation="f16_tma_3wg"); notes/p0-gemm.md,
    "The large-M candidate"): the weights' ring producer and the f16 activation's TMA in one
    warpgroup, so the CTA is three warpgroups (384 threads) and ptxas may give the consumers up
    to 168 registers a thread at compile time (65536 / 384), what 256 tokens' 128 accumulators
    need; at 512 threads the cap is 128 and the m64n256 wgmma does not fit.

    Role contract: one warpgroup at 40 registers; warp 0 is
    :class:`producers.register_order.WeightsOnlyRegisterOrderProducer` (the packed ring of
    weight slabs: ``full[s]`` one arrive + bytes, ``empty[s]`` the consumers' 8), warp 1 is
    :class:`F16TmaActivationStage` (``buffers`` f16 tiles: ``act_full[b]`` one arrive + bytes,
    ``act_empty[b]`` the consumers' 8). Both are built from this role's static config, so the
    compile key is its four integers."""

    warpgroups, regs = 1, 40
    extra_tx_bytes = 0

    def __init__(self, tile_m: int, tile_n: int, stages: int, buffers: int = 2):
        self.tile_m, self.tile_n, self.stages, self.buffers = tile_m, tile_n, stages, buffers
        self.tiles = self.activation.tiles
        self.weights  # noqa: B018  (its checks, now)

    @property
    def weights(self):
        return WeightsOnlyRegisterOrderProducer(self.tile_m, self.tile_n, self.stages)

    @property
    def activation(self):
        return F16TmaActivationStage(self.tile_m, self.stages, self.buffers)

    def barriers(self) -> dict:
        return {**self.weights.barriers(), **self.activation.barriers()}

    def arrivals(self) -> dict:
        return {**self.weights.arrivals(), **self.activation.arrivals()}

    def waits(self) -> tuple:
        return (*self.weights.waits(), *self.activation.waits())

    def named_barriers(self) -> dict:
        return {}

    def smem_bytes(self) -> int:
        return self.weights.smem_bytes() + self.activation.smem_bytes()

    def allocate(self, alloc) -> dict:
        return {**self.weights.allocate(alloc), **self.activation.allocate(alloc)}

    def global_views(self, a_ptr, sfa_ptr, b_ptr, sfb_ptr, M: Int32, N: Int32, k32: Int32):
        return self.weights.global_views(a_ptr, sfa_ptr, b_ptr, sfb_ptr, M, N, k32)

    @cute.jit
    def run(self, ctx, rt: Int32):
        warp = rt // WARP
        if warp == 0:
            self.weights.run(ctx, rt)
        elif warp == 1:
            self.activation.run(ctx, rt - WARP)


class QuantizingActivationStage:
    """P1's activation stage (kernels.nvfp4.gemm_shell.P1Study; notes/p1.md): fills the same
    f16 tiles from the **bf16** token tile that
    :class:`producers.register_order.Bf16RegisterOrderProducer` TMA'd into ring stage ``s``,
    quantizing each 16-element block with the tensor scale g (the shell's ``g_a``, computed
    beforehand: amax on the device) by :func:`device.nvfp4.quantize_block16` (the quantize
    kernel's rule, so the bits are P0's on the packed activation that kernel writes) and
    expanding it to exact f16 (:func:`device.nvfp4.quantize_expand_stage_rows`). No packed
    activation or activation scale is written anywhere.

    Role contract (kernels/nvfp4/gemm_shell.py): one warpgroup at ``regs`` registers. Owns
    ``buffers`` f16 tiles (:class:`F16Tiles`, which the consumer is built with) and their
    barriers: ``act_full[b]`` (4 arrivals: each warp after its stores and a
    ``fence.proxy.async``), ``act_empty[b]`` (the consumers' 8 warp arrivals after the wgmmas
    that read it retired). Reads the producer's ring of ``stages`` stages: waits on its
    ``full[s]``, arrives on its ``empty[s]`` (4 arrivals). ``expand`` (a hook): off only in the
    ablation build (P1Study(variant=P0Variant(skip_dequant=True))), which leaves the f16 tiles
    unwritten to time the rest alone.
    ``dump`` (off but in the debug build, P1Study(dump=True), one K split): every consumed
    tile's packed codes and scale bytes also go to global memory through the split-K workspace
    slot (device.nvfp4.quantize_expand_stage_rows), one copy per weight tile:
    kernels.nvfp4.gemm_p1.gemm_nvfp4_p1_dump reads them back."""

    warpgroups, regs = 1, 80
    expand = True
    dump = False
    TOKENS = (64, 128)  # 64: the N-group reuse study's tile (P1Study(groups=2, tokens=64))

    def __init__(self, tokens: int, stages: int, buffers: int = 2):
        if tokens not in self.TOKENS:
            raise ValueError(f"tokens = {tokens}: P1's stage quantizes tiles of "
                             f"{' or '.join(map(str, self.TOKENS))} rows")
        if not isinstance(buffers, int) or buffers < 2:
            # one tile cannot be refilled while the consumers still read it (with a wgmma group
            # in flight, use u is released only after u + 1 is issued: a deadlock)
            raise ValueError(f"buffers = {buffers!r}: the activation stage needs >= 2 f16 tiles")
        self.tokens, self.stages = tokens, stages
        self.tiles = F16Tiles(buffers, tokens * ROW_BYTES)

    def barriers(self) -> dict:
        return {"act_full": self.tiles.buffers, "act_empty": self.tiles.buffers}

    def arrivals(self) -> dict:
        return {"empty": WARPS, "act_full": WARPS}

    def waits(self) -> tuple:
        return ("full", "act_empty")

    def smem_bytes(self) -> int:
        return self.tiles.buffers * self.tiles.tile_bytes + 1024

    def allocate(self, alloc) -> dict:
        return {"act_f16": alloc.allocate(self.tiles.buffers * self.tiles.tile_bytes, 1024)}

    @cute.jit
    def run(self, ctx, t: Int32):
        sm = ctx.smem
        x_words = word_view(sm["x_bf16"], self.stages * self.tokens * ROW_BYTES)
        f16_words = word_view(sm["act_f16"], self.tiles.buffers * self.tiles.tile_bytes)
        g = ctx.scales[0][0]
        dump = None
        if cutlass.const_expr(self.dump):  # words, M (the output's rows), k-blocks
            dump = (cute.make_tensor(cute.recast_ptr(ctx.epi.work.iterator, dtype=Uint32),
                                     cute.make_layout(1 << 30)),  # nominal: host-sized
                    cute.size(ctx.epi.d, mode=[0]), ctx.tiles.k_tiles)
        for_each_tile(ctx.tiles, self.quantize_tile,
                      (x_words, f16_words, g, rcp_approx_ftz(g), ctx.bars["full"],
                       ctx.bars["empty"], ctx.bars["act_full"], ctx.bars["act_empty"],
                       ctx.mailbox, t, t % WARP, dump))

    @cute.jit
    def quantize_tile(self, tile, args, count: Int32) -> Int32:
        """Per k-block of ``tile``: wait for the bf16 stage and a free f16 tile, quantize and
        expand the stage's rows into it, release the stage and publish the tile."""
        (x_words, f16_words, g, rcp_g, full, empty, act_full, act_empty, mailbox, t, lane,
         dump) = args
        for kt in cutlass.range(tile.k0, tile.k1, unroll=1):
            s, ph = ring_position(count, self.stages)
            b, bph = ring_position(count, self.tiles.buffers)
            wait_parity(full + s, ph, Barrier.FULL, s, mailbox)
            wait_parity(act_empty + b, bph ^ 1, Barrier.ACT_EMPTY, b, mailbox)
            rows_dump = None
            if cutlass.const_expr(self.dump):  # this copy: [weight tile, token row, k-block]
                words, M, k_tiles = dump
                rows_dump = (words, (tile.n * M + tile.m * self.tokens) * k_tiles + kt,
                             k_tiles, M - tile.m * self.tokens)
            if cutlass.const_expr(self.expand):  # off only in the ablation build
                quantize_expand_stage_rows(t, WARPS * WARP, self.tokens, x_words, f16_words, s,
                                           b, g, rcp_g, rows_dump)
            # our f16 stores -> wgmma (async proxy); our bf16 reads -> the next TMA
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_warp()
            if lane == 0:
                cute.arch.mbarrier_arrive(empty + s)
                cute.arch.mbarrier_arrive(act_full + b)
            count = count + 1
        return count


class ClusterSharedTiles:
    """Mixin of an activation stage whose f16 tile one CTA of a cluster of C (2, 4 or 8, along
    N: one token tile, neighbouring weight tiles) fills and sends to the others
    (notes/p1.md, session 26). Ring use ``count`` is filled by rank ``count`` mod C, its
    *owner*; the f16 buffers are a multiple of C, so buffer b has one writer, rank b mod C.
    The subclass says how a tile is filled (:meth:`fill_views`, :meth:`fill_rows`) and which
    rows each of its 4 warps writes (:meth:`slice_plan`). (The packed activation's expansion
    shared the same way, #34's activation-source study, lost to the f16 source by 1.4-1.6x and
    left the code: notes/p0-gemm.md, session 26.)

    Each owner warp fills its rows of its *own* tile, fences them to the async proxy, then per
    peer one ``mbarrier.arrive.expect_tx`` of its rows' bytes on the peer's ``act_full[b]`` and
    one ``cp.async.bulk.shared::cluster.shared::cta`` a slice that completes them there: the
    bytes land through the async proxy before the peer's phase completes (TMA's contract; the
    session-24 pair's DSMEM stores instead gave wrong bits at C = 4 and 8 and were 8 % slower
    at C = 2: notes/p1.md, sessions 25-26). Remote arrives and waits use the default CTA-scope
    semantics, as CUTLASS's multicast pipelines do: the data's visibility is the transaction
    count's, and cluster-scope release fences cost ~0.5-1 µs each on the consumers' path.

    Barriers: ``act_full[b]`` 4 arrivals a use, the owner's warps (locally, and remotely on
    each peer with their bytes); ``act_empty[b]`` the consumer warps of all C CTAs (8 x C,
    declared by consumers.register_a_wgmma.PeerFedRegisterAWgmmaConsumer), waited by the owner
    before it writes b again; ``empty[s]`` this CTA's 4 warps every k-block
    (they wait on ``full[s]`` whether or not they fill it, which keeps the ring's phase) and
    its consumers. The producer loads the stage's activation on the owner only
    (producers.register_order: ``peers`` = C)."""

    # the ablation (its own compile key, set on an instance by the study): the owner fills only
    # its own tile, so the peers' wgmmas read stale f16 (wrong, timing only): what sending costs
    local_only = False

    def _check_cluster(self, peers: int) -> None:
        if peers not in (2, 4, 8):
            raise ValueError(f"peers = {peers!r}: a cluster of 2, 4 or 8 CTAs")
        if self.tiles.buffers % peers:
            # ring use c is owned by rank c mod C and written into buffer c mod buffers: only
            # with buffers a multiple of C does each buffer keep one owner, whose parity wait
            # on act_empty then follows every phase of it; a buffer passed between owners lets
            # an owner's wait alias a phase it never saw (session 25: C = 4 at 2 buffers hung)
            raise ValueError(f"{self.tiles.buffers} f16 buffers for a cluster of {peers}: a "
                             f"multiple of {peers}, so that each buffer has one writer")
        self.peers = peers

    def slice_plan(self) -> tuple:
        """(first rows, warp stride, rows): warp w fills rows ``first + w x stride`` .. ``+ rows``
        of the f16 tile for each of the first rows (static)."""
        raise NotImplementedError

    @cute.jit
    def run(self, ctx, t: Int32):
        for_each_tile(ctx.tiles, self.share_tile,
                      (self.fill_views(ctx), ctx.bars["full"], ctx.bars["empty"],
                       ctx.bars["act_full"], ctx.bars["act_empty"], ctx.mailbox, t, t % WARP))

    @cute.jit
    def share_tile(self, tile, args, count: Int32) -> Int32:
        """Per k-block of ``tile``: the owner waits for its free f16 tile (every CTA's
        consumers released it), fills it and sends it; every CTA gives the ring stage back."""
        views, full, empty, act_full, act_empty, mailbox, t, lane = args
        f16_words = views[0]
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        others = []  # the other ranks, rank ^ i (a bijection on 0 .. C - 1 for C a power of 2)
        for i in cutlass.range_constexpr(1, self.peers):
            others.append(rank ^ i)
        others = tuple(others)
        warp = t // WARP
        for kt in cutlass.range(tile.k0, tile.k1, unroll=1):
            s, ph = ring_position(count, self.stages)
            b, bph = ring_position(count, self.tiles.buffers)
            wait_parity(full + s, ph, Barrier.FULL, s, mailbox)
            if count % self.peers == rank:
                wait_parity(act_empty + b, bph ^ 1, Barrier.ACT_EMPTY, b, mailbox)
                self.fill_rows(views, t, s, b)
                # our f16 stores -> wgmma and the bulk copies (async proxy)
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.sync_warp()
                if lane == 0:
                    cute.arch.mbarrier_arrive(empty + s)
                    cute.arch.mbarrier_arrive(act_full + b)
                    if cutlass.const_expr(self.local_only):  # the count only, no bytes
                        for peer in others:
                            cute.arch.mbarrier_arrive(act_full + b, peer)
                    else:
                        self._send(f16_words, act_full + b, b, warp, others)
            else:  # a peer fills this k-block: only the stage goes back
                cute.arch.sync_warp()
                if lane == 0:
                    cute.arch.mbarrier_arrive(empty + s)
            count = count + 1
        return count

    @cute.jit
    def _send(self, f16_words, bar, b: Int32, warp: Int32, others):
        """This warp's rows of f16 tile ``b`` to every peer: their bytes announced on the peer's
        ``bar``, then one bulk copy a slice completing them there."""
        firsts, stride, rows = self.slice_plan()
        for peer in others:
            arrive_expect_tx_cluster(bar, peer, len(firsts) * rows * ROW_BYTES)
            for first in firsts:
                src = f16_words[(None, (b * self.tokens + first + warp * stride) * ROW_CHUNKS)]
                bulk_copy_s2peer(src.iterator, rows * ROW_BYTES, bar, peer)


class ClusterQuantizingActivationStage(ClusterSharedTiles, QuantizingActivationStage):
    """Study (kernels.nvfp4.gemm_shell.P1Study(cluster=C); notes/p1.md, "C = 2", "C = 4 and 8"
    and session 26): P1's stage (:class:`QuantizingActivationStage`'s quantizer) shared by a
    cluster of C CTAs (:class:`ClusterSharedTiles`), so each CTA quantizes 1 / C of the
    k-blocks. Each thread quantizes one token row, so warp w fills rows 32w .. 32w + 31 (one
    4 KB slice)."""

    def __init__(self, tokens: int, stages: int, buffers: int = 2, peers: int = 2):
        super().__init__(tokens, stages, buffers)
        if tokens != WARPS * WARP:
            raise ValueError(f"tokens = {tokens}: the cluster's quantizer takes one row a "
                             f"thread ({WARPS * WARP})")
        self._check_cluster(peers)

    def slice_plan(self) -> tuple:
        return (0,), WARP, WARP

    @cute.jit
    def fill_views(self, ctx) -> tuple:
        sm = ctx.smem
        x_words = word_view(sm["x_bf16"], self.stages * self.tokens * ROW_BYTES)
        f16_words = word_view(sm["act_f16"], self.tiles.buffers * self.tiles.tile_bytes)
        g = ctx.scales[0][0]
        return f16_words, x_words, g, rcp_approx_ftz(g)

    @cute.jit
    def fill_rows(self, views, t: Int32, s: Int32, b: Int32):
        f16_words, x_words, g, rcp_g = views
        quantize_expand_stage_rows(t, WARPS * WARP, self.tokens, x_words, f16_words, s, b, g,
                                   rcp_g)
