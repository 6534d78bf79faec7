"""P2's persistent work queue (issue #39; notes/p2.md, "Design: the persistent work queue"): one
launch in which ``producers`` quantizer CTAs turn row chunks of the bf16 activation into a
bounded ring of exact f16 rows while the GEMM's CTAs run the whole call's tiles as their chunks
become ready, so the activation's packed and f16 tensors never exist in full and no chunk ends
in a launch's partial round.

The ring holds ``slots`` chunks of ``capacity`` rows: f16 [slots x capacity, K], the values
``quantize_expand_nvfp4`` writes (e2m1 · s, Comfy's rule through
:func:`device.nvfp4.quantize_block16`), which the 256-token f16 build reads by TMA. Chunk c
lives in slot c mod slots; because ``capacity`` is a whole number of 256-row token tiles, the
output's token tile m reads ring token tile m mod (the ring's token tiles), and every GEMM tile
is the whole call's tile on the same values in the same K order: the output is bit-identical to
``gemm_nvfp4(..., a16=<the whole expansion>, config=<the same build>)``.

Counters (int32 in global memory, zeroed by the host before each launch; :class:`QueueLayout`):
``[claim, ready[chunks], done[chunks]]``.
  * ready[c]: each quantizer CTA adds 1 after its share of chunk c is stored (``bar.sync``, then
    one thread ``fence.acq_rel.gpu`` + ``red.release.gpu``); a GEMM CTA's activation warp waits
    (``ld.acquire.gpu``, bounded: device.waits.wait_counter) for ``producers`` before each
    tile's first TMA of that chunk, then ``fence.proxy.async.global`` (the TMA reads through the
    async proxy, which the acquire alone does not order).
  * done[c]: consumer thread 0 of each GEMM CTA adds 1 per tile of chunk c once the tile's last
    k-block has landed in shared memory (its TMA reads of the ring are complete); a quantizer
    waits for every tile of chunk c (token tiles x weight tiles) before it overwrites that slot
    with chunk c + slots, then fences the async proxy before its stores.
  * claim: the first timed-out waiter of the launch writes the report (device.waits).
Deadlock freedom: chunk c's quantizers wait only on chunk c - slots's tiles, which wait only on
chunk c - slots's quantizers; every CTA walks its work in increasing chunk order; with every CTA
resident each wait is on strictly earlier work. Residency: the grid is at most one CTA an SM
(the host checks it against the SM count and the occupancy API and refuses MPS); the quantizers
are the grid's first CTAs, so they are dispatched first. What the static tile walk cannot
survive is two queue launches each holding part of the GPU while the other's CTAs wait for SMs
(each would wait on tiles of its own CTAs that are not resident); the hardware dispatches a
grid's CTAs before a later grid's, so a launch that started first becomes wholly resident and
finishes, but a launch must not depend on residency it cannot check: the waits then trap after
1 s (the counters) or 2 s (the barriers) with a report instead of hanging (notes/p2.md).
Claiming tiles from an atomic ticket would remove that case; it is not built.
"""
from __future__ import annotations

from dataclasses import dataclass

from configs.arch import WARP
from device.nvfp4 import expand_block16, quantize_block16
from device.ptx import fence_proxy_async_global, rcp_approx_ftz, red_release_gpu_add
from device.runtime import cute_modules
from device.waits import TIMEOUT_NS, wait_counter
from producers.activation_stage import F16TmaActivationStage, WeightsAndF16Producer

cutlass, cute = cute_modules()
from cutlass import Int32, Uint32  # noqa: E402

TOKENS = 256  # the 256-token f16 build's token tile: chunks are whole tiles of it
BLOCK_WORDS = 8  # a 16-element block of bf16/f16 (or of its f16 expansion) in 32-bit words
# The counter waits' bound, half the barriers' (device.waits): a stalled chunk stops the GEMM
# CTA's activation warp on its counter and, behind it, the consumers on the stage's barrier,
# which started waiting first; the shorter bound makes the counter the one the report names.
COUNTER_TIMEOUT_NS = TIMEOUT_NS // 2


@dataclass(frozen=True)
class QueueLayout:
    """The work queue's static shape: ``capacity`` rows a chunk (a multiple of 256), ``slots``
    chunks in the ring (>= 2), ``producers`` quantizer CTAs, ``bf16`` input (else f16),
    ``loads`` blocks each quantizer thread has in flight."""
    capacity: int
    slots: int
    producers: int
    bf16: bool = True
    loads: int = 4  # 16-element blocks a quantizer thread loads before quantizing the first

    def __post_init__(self):
        for name in ("capacity", "slots", "producers", "loads"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"{name} must be an int, got {v!r}")
        if self.capacity <= 0 or self.capacity % TOKENS:
            raise ValueError(f"capacity = {self.capacity} rows must be a positive multiple of "
                             f"{TOKENS} (the 256-token build's tile: a chunk is whole tiles)")
        if self.slots < 2:
            raise ValueError(f"slots = {self.slots}: the ring needs >= 2 slots (one filling "
                             "while the GEMM reads another)")
        if self.producers < 1:
            raise ValueError(f"producers = {self.producers}: at least one quantizer CTA")
        if not 1 <= self.loads <= 8:
            raise ValueError(f"loads = {self.loads}: 1..8 blocks in flight a thread")

    @property
    def chunk_tiles(self) -> int:
        """Token tiles of a chunk."""
        return self.capacity // TOKENS

    @property
    def ring_rows(self) -> int:
        return self.slots * self.capacity

    @property
    def ring_tiles(self) -> int:
        return self.ring_rows // TOKENS

    def chunks(self, M):
        return (M + self.capacity - 1) // self.capacity

    def counter_names(self, M: int) -> list:
        """Each counter word's name, for the trap report (device.waits.synchronize)."""
        n = self.chunks(M)
        return (["claim"] + [f"ready[{c}] (quantizers of chunk {c})" for c in range(n)]
                + [f"done[{c}] (tiles of chunk {c} read)" for c in range(n)])

    def expected_counts(self, M: int, n_tiles: int) -> list:
        """What a finished launch leaves in the counters: every chunk ready from every
        quantizer, every tile of every chunk counted done (claim 0)."""
        n = self.chunks(M)
        tiles = [-(-min(self.capacity, M - c * self.capacity) // TOKENS) * n_tiles
                 for c in range(n)]
        return [0] + [self.producers] * n + tiles

    def counter_words(self, M: int) -> int:
        """int32 counters a launch over M rows needs: the claim, ready and done per chunk."""
        return 1 + 2 * self.chunks(M)


def ready_slot(c):
    return 1 + c


def done_slot(c, chunks):
    return 1 + chunks + c


class RingF16ActivationStage(F16TmaActivationStage):
    """:class:`F16TmaActivationStage` reading the work queue's ring: before a tile's first TMA it
    waits until the tile's chunk is ready (all ``producers`` quantizer CTAs counted in), fences
    the async proxy, and loads the chunk's ring slot (token tile m mod the ring's tiles). The
    role contract is its parent's; the counters are the shell's per-tile counter array
    (``ctx.epi.count``, unused by a one-split tile loop)."""

    def __init__(self, tokens: int, stages: int, buffers: int, layout: QueueLayout):
        if tokens != TOKENS:
            raise ValueError(f"tokens = {tokens}: the work queue runs the {TOKENS}-token build")
        super().__init__(tokens, stages, buffers)
        self.layout = layout

    def fill_args(self, ctx) -> tuple:
        counters = ctx.epi.count
        return (counters, cute.make_tensor(counters.iterator, cute.make_layout(1)))

    @cute.jit
    def fill_tile(self, tile, args, count: Int32) -> Int32:
        mailbox, counters, claim = args[3], args[4], args[5]
        q = self.layout
        wait_counter(counters, Int32(ready_slot(tile.m // q.chunk_tiles)), Int32(q.producers),
                     tile.m, mailbox, claim, COUNTER_TIMEOUT_NS)
        fence_proxy_async_global()  # the acquire orders generic reads; the TMA is async
        return self.load_rows(tile.m % q.ring_tiles, tile, args, count)


class RingWeightsAndF16Producer(WeightsAndF16Producer):
    """:class:`WeightsAndF16Producer` of the work queue: warp 0 the weight slabs, warp 1 the
    ring's f16 rows (:class:`RingF16ActivationStage`), and in the grid's first ``producers`` CTAs
    the quantizer (:meth:`quantize_chunks`, every thread of the CTA, no role). Static config:
    the parent's and the :class:`QueueLayout`'s fields (hashable ints: the compile key)."""

    def __init__(self, tile_m: int, tile_n: int, stages: int, buffers: int,
                 layout: QueueLayout):
        self.layout = layout
        super().__init__(tile_m, tile_n, stages, buffers)

    @property
    def queue_producers(self) -> int:
        """Quantizer CTAs the shell appends to the grid (kernels.nvfp4.gemm_shell)."""
        return self.layout.producers

    @property
    def activation(self):
        return RingF16ActivationStage(self.tile_m, self.stages, self.buffers, self.layout)

    def global_views(self, a_ptr, sfa_ptr, b_ptr, sfb_ptr, M: Int32, N: Int32, k32: Int32):
        """The ring's TMA (``a``: f16 [ring rows, K]) and the weights, as the parent's; then the
        quantizer's views: the bf16 activation (``sfa``: [M, K], 32-bit words), the ring as
        words and the 16-element blocks a row."""
        tma, weights = self.weights.global_views(a_ptr, sfa_ptr, b_ptr, sfb_ptr,
                                                 Int32(self.layout.ring_rows), N, k32)
        k_blocks = k32 * 2
        x_words = cute.make_tensor(cute.recast_ptr(sfa_ptr, dtype=Uint32),
                                   cute.make_layout(M * k_blocks * BLOCK_WORDS))
        ring_words = cute.make_tensor(cute.recast_ptr(a_ptr, dtype=Uint32), cute.make_layout(
            self.layout.ring_rows * k_blocks * BLOCK_WORDS))
        return tma, (weights, x_words, ring_words, k_blocks)

    @cute.jit
    def run(self, ctx, rt: Int32):
        warp = rt // WARP
        weights_ctx = ctx._replace(globals=ctx.globals[0])  # the weight warp's views only
        if warp == 0:
            self.weights.run(weights_ctx, rt)
        elif warp == 1:
            self.activation.run(ctx, rt - WARP)

    @cute.jit
    def quantize_chunks(self, ctx, q: Int32, t: Int32, threads: cutlass.Constexpr[int]):
        """Quantizer CTA ``q`` of ``producers``, thread ``t`` of ``threads``: for each chunk, in
        order, wait until its slot's previous chunk is read (every tile of it counted in
        done), quantize and expand its share of the chunk's 16-element blocks into the slot
        (blocks q·threads + t, strided by producers·threads: consecutive threads take
        consecutive 32-byte blocks), then count this CTA into the chunk's ready."""
        lay = self.layout
        _, x_words, ring_words, k_blocks = ctx.globals
        counters = ctx.epi.count
        claim = cute.make_tensor(counters.iterator, cute.make_layout(1))
        M = cute.size(ctx.epi.d, mode=[0])
        n_tiles = (cute.size(ctx.epi.d, mode=[1]) * 2 + self.tile_n - 1) // self.tile_n
        g = ctx.scales[0][0]
        rcp_g = rcp_approx_ftz(g)
        gx = cute.zipped_divide(x_words, (BLOCK_WORDS,))
        gr = cute.zipped_divide(ring_words, (BLOCK_WORDS,))
        chunks = lay.chunks(M)
        stride = lay.producers * threads
        for c in cutlass.range(chunks, unroll=1):
            if c >= lay.slots:  # the slot's previous chunk: whole, so all its tiles
                if t == 0:
                    wait_counter(counters, done_slot(c - lay.slots, chunks),
                                 Int32(lay.chunk_tiles) * n_tiles, c, ctx.mailbox, claim,
                                 COUNTER_TIMEOUT_NS)
                cute.arch.sync_threads()
                fence_proxy_async_global()  # the TMA's reads of the slot before our stores
            rows = cutlass.min(lay.capacity, M - c * lay.capacity)
            src = c * lay.capacity * k_blocks
            dst = (c % lay.slots) * lay.capacity * k_blocks
            items = rows * k_blocks
            for i0 in cutlass.range(q * threads + t, items, stride * lay.loads, unroll=1):
                # every load of the round in flight before the first use: one 32-byte load a
                # thread at a time would hold ~12 KB in flight an SM, ~15 GB/s at DRAM latency
                w = [cute.make_rmem_tensor((BLOCK_WORDS,), Uint32) for _ in range(lay.loads)]
                for u in cutlass.range_constexpr(lay.loads):
                    if i0 + u * stride < items:
                        cute.autovec_copy(gx[(None, src + i0 + u * stride)], w[u])
                for u in cutlass.range_constexpr(lay.loads):
                    i = i0 + u * stride
                    if i < items:
                        codes = cute.make_rmem_tensor((2,), Uint32)
                        s8 = quantize_block16(w[u], g, rcp_g, codes, lay.bf16)
                        cute.autovec_copy(expand_block16(codes, s8), gr[(None, dst + i)])
            fence_proxy_async_global()  # our generic stores, before the TMA readers' acquire
            cute.arch.sync_threads()
            if t == 0:
                cute.arch.fence_acq_rel_gpu()
                red_release_gpu_add(counters.iterator + ready_slot(c), Int32(1))
