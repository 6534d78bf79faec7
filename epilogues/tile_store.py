"""TileStore: the epilogue module of the GEMM shell (contract in :mod:`epilogues`).

``splits == 1``: every consumer thread applies the output rule to its accumulator pairs and
stores each pair as one 32-bit word (rows past M and columns past N are not written; N is a
multiple of 8, so pairs never straddle N).

``splits > 1``: each of the ``splits`` CTAs of an output tile stores its fp32 partial sums to the
workspace as ``st.global.v4.f32`` in fragment order (two pairs a vector), warp-interleaved so
that one store instruction of a warp fills 512 contiguous bytes: word w of vector v of thread ct
of (split, tile) lies at ((split·tiles + tile)·V + v)·threads·4 + ct·4 + w, V = pairs / 2. The
last CTA to arrive (an acq_rel counter per tile) holds the same fragment in the same thread, so
it reads the same vectors of every split (``ld.relaxed.gpu.global.v4.f32``, coherent, never a
stale L1 line) and adds them in split order 0, 1, ..., so the result does not depend on arrival
order (two runs are bit-identical), applies the output rule, and re-arms the counter to 0 for
the next launch. Still an fp32 accumulation of exact products in some fixed order: the oracle's
bound holds unchanged. The workspace holds :func:`workspace_floats` fp32 words (whole tiles:
rows past M and columns past N are stored and never read into D).

Under stream-K (``stream_k``: device.tiles.StreamKSchedule) a tile's split count is its
``segments``, a launch-time value: a tile inside one CTA's share (1 segment) stores directly,
the others go through the same store with the segments as the counter's target and the bound of
the reduce loop (segment 0, 1, ... in K order).

Synchronisation (the consumer's ``threads``, which the shell checks against the consumer):
stores -> ``fence.acq_rel.gpu`` -> named barrier ``barrier`` -> one thread
``atom.add.acq_rel.gpu`` on the tile's counter and publishes "last" in smem -> ``barrier`` ->
the last CTA fences and reads the partials. No CTA waits on another, so this cannot deadlock.

:class:`ClusterSplitStore` is the other production split store: a tile's K splits as one
cluster, the partials reduced in distributed shared memory (the plan's choice at two splits).

The scalar fixup this replaced (one 4-byte store and load per partial, 14-33 µs a call at
M = 128 against 6-13 µs for this one on the H200) is in git: ``git show bccfed9:epilogues/
tile_store.py``; notes/p0-gemm.md, P0 v3 1(a).
"""
from __future__ import annotations

from dataclasses import dataclass

from configs.arch import WARP
from device.barriers import Barrier, NamedBarrier
from device.ptx import _asm_effect, _gaddr, arrive_cluster_release, ld_shared_v4_f32, \
    st_cluster_f32x4
from device.runtime import cute_modules
from device.waits import count_split_arrival, wait_parity
from epilogues.alpha_bf16 import AlphaBf16

PARTIAL_WORDS = 4  # fp32 partial sums per 16-byte store

cutlass, cute = cute_modules()
from cutlass import Float32, Int32  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402
from cutlass.cutlass_dsl import T, dsl_user_op  # noqa: E402


@dataclass(frozen=True)
class TileStore:
    """The consumer's thread count (``threads``: every one of them calls :meth:`store`), an
    output rule, the split count and the named barrier the split-K store syncs those threads
    on. Frozen: the DSL treats a frozen dataclass whose method a loop calls as read-only (a
    plain object would be loop-carried state)."""

    threads: int
    output: object = None
    splits: int = 1
    barrier: NamedBarrier = NamedBarrier.EPILOGUE
    stream_k: bool = False  # segments per tile from the schedule (``tile.segments``)

    def __post_init__(self):
        if not isinstance(self.threads, int) or self.threads <= 0 or self.threads % WARP:
            raise ValueError(f"threads = {self.threads!r}: a named barrier takes whole warps")
        if not isinstance(self.splits, int) or self.splits < 1:
            raise ValueError(f"splits = {self.splits!r}: need an int >= 1")
        if self.stream_k and self.splits != 1:
            raise ValueError(f"splits = {self.splits} with stream_k: the stream-K schedule cuts "
                             "the tiles itself (splits must be 1)")
        if not isinstance(self.barrier, NamedBarrier) or \
                self.barrier == NamedBarrier.SYNC_THREADS:
            raise ValueError(f"barrier = {self.barrier!r}: a NamedBarrier other than "
                             "SYNC_THREADS (the whole CTA)")
        if self.output is None:
            object.__setattr__(self, "output", AlphaBf16())
        if not callable(getattr(self.output, "pair", None)):
            raise TypeError(f"output rule {type(self.output).__name__} has no pair()")

    @property
    def operands(self) -> tuple:
        return tuple(self.output.operands)

    def named_barriers(self) -> dict:
        """{id: threads} of the named barriers :meth:`store` syncs on."""
        return {self.barrier: self.threads} if self.splits > 1 or self.stream_k else {}

    # what the shell provides a fixup beyond the flag word (only ClusterSplitStore asks for
    # any): the CTAs of a K-split cluster, mbarriers {name: arrive count}, and the
    # shared-memory bytes of a receive buffer for a tile of ``tile_elems`` fp32
    cluster_k = 1

    def fixup_barriers(self) -> dict:
        return {}

    def fixup_smem_bytes(self, tile_elems: int) -> int:
        return 0

    def key(self) -> tuple:
        """Identity for the compile cache: the rule's class, the splits, the threads and the
        barrier (and stream-K, where set)."""
        cls = type(self.output)
        key = (cls.__module__, cls.__qualname__, self.splits, self.threads, int(self.barrier))
        return (*key, "stream_k") if self.stream_k else key

    @cute.jit
    def store(self, pairs, ops, tile):
        """Write one tile. ``pairs``: the consumer's [(m, n, x0, x1)], fp32 sums of D[m, n] and
        D[m, n + 1] in tile coordinates (n even)."""
        M, N2 = ops.d.shape
        if cutlass.const_expr(self.stream_k):
            if tile.segments == Int32(1):  # the tile lies inside this CTA's share
                self._store_direct(pairs, ops, tile, M, N2)
            else:
                self._store_split(pairs, ops, tile, M, N2, tile.segments)
        elif cutlass.const_expr(self.splits == 1):
            self._store_direct(pairs, ops, tile, M, N2)
        else:
            self._store_split(pairs, ops, tile, M, N2, self.splits)

    @cute.jit
    def _store_direct(self, pairs, ops, tile, M: Int32, N2: Int32):
        """The output rule's pairs straight into D (inside M and N)."""
        for m, n, x0, x1 in pairs:
            row = tile.m0 + m
            pair = (tile.n0 + n) // 2
            if row < M and pair < N2:
                ops.d[row, pair] = self.output.pair(ops, row, pair, x0, x1)

    @cute.jit
    def _arrive(self, ops, tile, splits):
        """After this CTA's partials are stored: publish them (fence), count this split's
        arrival for the tile (one thread), and return the one-element flag tensor, 1 in the
        last of the tile's ``splits`` to arrive, which then reduces."""
        cute.arch.fence_acq_rel_gpu()
        cute.arch.barrier(barrier_id=self.barrier, number_of_threads=self.threads)
        flag_t = cute.make_tensor(ops.flag, cute.make_layout(1))
        if tile.ct == 0:
            count_split_arrival(ops.count, tile.tile_id, splits, flag_t)
        cute.arch.barrier(barrier_id=self.barrier, number_of_threads=self.threads)
        return flag_t

    @cute.jit
    def _store_split(self, pairs, ops, tile, M: Int32, N2: Int32, splits):
        """``splits``: the tile's split count, an int (static splits) or an Int32 (stream-K
        segments, added by a loop the count bounds)."""
        if cutlass.const_expr(len(pairs) % 2):
            raise ValueError(f"{len(pairs)} accumulator pairs a thread: the split-K store "
                             "writes them two to a 16-byte vector")
        vectors = len(pairs) // 2
        tiles = cute.size(ops.count.shape)
        stride = self.threads * PARTIAL_WORDS  # one vector of every thread of the CTA
        base = ops.work.iterator + tile.ct * PARTIAL_WORDS
        own = base + (tile.split * tiles + tile.tile_id) * vectors * stride
        for v in cutlass.range_constexpr(vectors):
            (_, _, a0, a1), (_, _, b0, b1) = pairs[2 * v], pairs[2 * v + 1]
            _st_global_v4_f32(own + v * stride, (a0, a1, b0, b1))
        flag_t = self._arrive(ops, tile, splits)
        if flag_t[0] == Int32(1):
            cute.arch.fence_acq_rel_gpu()
            for v in cutlass.range_constexpr(vectors):
                at = base + tile.tile_id * vectors * stride + v * stride
                s = _ld_relaxed_gpu_v4_f32(at)
                if cutlass.const_expr(isinstance(splits, int)):
                    for sp in cutlass.range_constexpr(1, splits):
                        p = _ld_relaxed_gpu_v4_f32(at + sp * tiles * vectors * stride)
                        s = [s[w] + p[w] for w in range(PARTIAL_WORDS)]
                else:
                    s0, s1, s2, s3 = s
                    for sp in cutlass.range(1, splits, unroll=1):
                        p = _ld_relaxed_gpu_v4_f32(at + sp * tiles * vectors * stride)
                        s0, s1, s2, s3 = s0 + p[0], s1 + p[1], s2 + p[2], s3 + p[3]
                    s = [s0, s1, s2, s3]
                for h in cutlass.range_constexpr(2):
                    m, n, _, _ = pairs[2 * v + h]
                    row = tile.m0 + m
                    col = tile.n0 + n
                    if row < M and col < N2 * 2:
                        ops.d[row, col // 2] = self.output.pair(ops, row, col // 2, s[2 * h],
                                                                s[2 * h + 1])


def workspace_floats(splits: int, tiles: int, tile_m: int, tile_n: int) -> int:
    """fp32 words of the split-K workspace: every split of every tile, whole tiles (under
    stream-K ``splits`` is the bound on a tile's segments, device.tiles.max_stream_k_segments)."""
    return splits * tiles * tile_m * tile_n if splits > 1 else 0


# ---- the K-split cluster's on-chip reduction ---------------------------------------------------
CLUSTER_SPLITS = (2, 3)  # the K-split clusters built (#34 1(a) measured both; plan picks 2)


@dataclass(frozen=True)
class ClusterSplitStore(TileStore):
    """The split-K store of a K-split cluster: the S = ``splits`` (2 or 3) CTAs of one tile's K
    splits are one cluster, split s at rank s (the shell launches clusters of
    :attr:`cluster_k` = S along grid y: device.tiles.TileSchedule(cluster_k=S)), and the
    partials are reduced in distributed shared memory instead of through a global workspace
    (notes/p0-gemm.md, sessions 26 and 27: 2.3-3.9 µs a call at two splits against the global
    fixup's 7.6-7.7). A thread's V = pairs / 2 16-byte vectors (16 for the swap-AB consumer)
    are cut into S shares, share q = vectors [qV/S, (q+1)V/S), which rank q reduces and stores.
    Per tile, in every consumer thread (the epilogue's ``threads``):

    1. wait (cluster-scope acquire) on its own ``fix_free`` for the previous tile's phase (a
       fresh barrier passes): every peer has read what this CTA sent it last tile;
    2. send: each peer q's share of its partial, ``st.shared::cluster.v4.f32`` into q's receive
       buffer at slot (this rank's index among q's senders), vector, thread: one warp store
       fills 512 contiguous bytes, and the reader is the same thread of q, so it reads back
       exactly its own fragment positions;
    3. named barrier ``barrier``; thread 0 arrives (``mbarrier.arrive.release.cluster``) on
       every peer's ``fix_full``: the barrier orders the CTA's stores before that release;
    4. wait (cluster-scope acquire) on its own ``fix_full`` for this tile's phase, then sum its
       share in split order (p0 + p1) + p2, its own partial from registers at its rank's place
       and the others' from its buffer (``ld.shared.v4.f32``): the global fixup's fp32 adds in
       its order, so :class:`TileStore`'s bits at the same split; then the output rule into D;
    5. named barrier; thread 0 arrives (release, cluster scope) on every peer's ``fix_free``.

    Barriers (the shell allocates them and arms them before the cluster's start barrier):
    ``fix_full`` and ``fix_free``, one each a CTA, arrive count S - 1 (one thread of each
    peer), waited on by all ``threads`` at parity (the CTA's tile count k) & 1, resp.
    ((k & 1) ^ 1). k = tile id // G (G clusters in the grid: the CTA's k-th tile is work item
    c + kG, and its tile id is its work item under the N-major raster the shell requires).
    No deadlock: a CTA's sends of tile k wait only on its peers' reads of tile k - 1, which
    need only every CTA's sends of tile k - 1; the waits are inside one cluster, whose CTAs the
    hardware makes resident together. No CTA exits while a peer may write or arrive into it:
    the shell's closing cluster barrier. Receive buffer: (S - 1) x ceil(V / S) x threads x 16
    bytes (32 KB at S = 2, 48 KB at S = 3), its own (not the ring's: under a persistent walk
    the producer refills the ring while the consumers run the epilogue). No global workspace,
    counter, gpu-scope fence or atomic."""

    def __post_init__(self):
        super().__post_init__()
        if self.splits not in CLUSTER_SPLITS:
            raise ValueError(f"splits = {self.splits}: a K-split cluster of {CLUSTER_SPLITS} "
                             "CTAs (a cluster of 3 fits a GPC's SMs several times; more are "
                             "not measured by #34 1(a))")

    def key(self) -> tuple:
        return (*super().key(), "cluster")

    @property
    def cluster_k(self) -> int:
        return self.splits

    def fixup_barriers(self) -> dict:
        return {"fix_full": self.splits - 1, "fix_free": self.splits - 1}

    def fixup_smem_bytes(self, tile_elems: int) -> int:
        return (self.splits - 1) * self._slot_vectors(self._vectors(tile_elems)) \
            * self.threads * 16

    def _vectors(self, tile_elems: int) -> int:
        """16-byte vectors of partial sums a thread (two pairs each)."""
        per_thread, rem = divmod(tile_elems, self.threads * PARTIAL_WORDS)
        if rem or per_thread < self.splits:
            raise ValueError(f"a tile of {tile_elems} fp32 over {self.threads} threads is not "
                             f"whole 16-byte vectors, at least {self.splits} a thread")
        return per_thread

    def _slot_vectors(self, vectors: int) -> int:
        """Vectors of the largest share (the receive buffer's slot)."""
        return max(self._share(q, vectors)[1] - self._share(q, vectors)[0]
                   for q in range(self.splits))

    def _share(self, q: int, vectors: int) -> tuple:
        """[v0, v1): the vectors rank ``q`` reduces and stores."""
        return q * vectors // self.splits, (q + 1) * vectors // self.splits

    @cute.jit
    def _store_split(self, pairs, ops, tile, M: Int32, N2: Int32, splits):
        """The K-split cluster's exchange and reduce (the class docstring's steps 1-5)."""
        S = self.splits
        if cutlass.const_expr(len(pairs) % 2):
            raise ValueError(f"{len(pairs)} accumulator pairs a thread: the DSMEM fixup "
                             "sends them two to a 16-byte vector")
        vectors = len(pairs) // 2
        slot_v = self._slot_vectors(vectors)
        recv, full, free, mailbox = ops.fixup
        rank = tile.split  # the schedule's K-split cluster: split s at rank s
        _, _, clusters = cute.arch.grid_dim()
        use = tile.tile_id // Int32(clusters)
        ph = use & 1
        # 1. every peer has read what this CTA sent it for the previous tile
        wait_parity(free, ph ^ 1, Barrier.FIX_FREE, rank, mailbox, cluster=True)
        # 2. each peer q's share of this partial into q's buffer, at this rank's slot there
        for q in cutlass.range_constexpr(S):
            if rank != Int32(q):
                slot = cutlass.select_(rank < Int32(q), rank, rank - 1)
                v0, v1 = self._share(q, vectors)
                for v in cutlass.range_constexpr(v0, v1):
                    (_, _, a0, a1), (_, _, b0, b1) = pairs[2 * v], pairs[2 * v + 1]
                    at = ((slot * slot_v + (v - v0)) * self.threads + tile.ct) * PARTIAL_WORDS
                    st_cluster_f32x4(recv + at, Int32(q), (a0, a1, b0, b1))
        # 3. the CTA's stores, then one release a peer
        cute.arch.barrier(barrier_id=self.barrier, number_of_threads=self.threads)
        if tile.ct == 0:
            for q in cutlass.range_constexpr(S):
                if rank != Int32(q):
                    arrive_cluster_release(full, Int32(q))
        # 4. the peers' shares of this rank's vectors, summed in split order, then D
        wait_parity(full, ph, Barrier.FIX_FULL, rank, mailbox, cluster=True)
        for q in cutlass.range_constexpr(S):
            if rank == Int32(q):
                v0, v1 = self._share(q, vectors)
                for v in cutlass.range_constexpr(v0, v1):
                    s = None
                    for sp in cutlass.range_constexpr(S):
                        if cutlass.const_expr(sp == q):
                            (_, _, a0, a1), (_, _, b0, b1) = pairs[2 * v], pairs[2 * v + 1]
                            p = [a0, a1, b0, b1]
                        else:
                            at = (((sp - (1 if sp > q else 0)) * slot_v + (v - v0))
                                  * self.threads + tile.ct) * PARTIAL_WORDS
                            p = ld_shared_v4_f32(recv + at)
                        s = p if s is None else [s[w] + p[w] for w in range(PARTIAL_WORDS)]
                    for h in cutlass.range_constexpr(2):
                        m, n, _, _ = pairs[2 * v + h]
                        row = tile.m0 + m
                        col = tile.n0 + n
                        if row < M and col < N2 * 2:
                            ops.d[row, col // 2] = self.output.pair(ops, row, col // 2,
                                                                    s[2 * h], s[2 * h + 1])
        # 5. every thread has read its buffer: the peers may send the next tile's
        cute.arch.barrier(barrier_id=self.barrier, number_of_threads=self.threads)
        if tile.ct == 0:
            for q in cutlass.range_constexpr(S):
                if rank != Int32(q):
                    arrive_cluster_release(free, Int32(q))


# ---- study (scripts/p0_v3_ab.py and tests build it; never a production choice) ---------------
SPLIT_FIXUPS = ("skip",)


@dataclass(frozen=True)
class SplitFixupStudy(TileStore):
    """Split-K fixup studies (notes/p0-gemm.md, P0 v3 measurement 1(a)); ``splits`` >= 2. The
    vectorised fixup measured beside them at 8438956 won and is :class:`TileStore`'s own; the
    DSMEM reduction (session 26) is :class:`ClusterSplitStore`.

    ``fixup = "skip"``: no partials, no counter, no reduction; every split CTA stores its own
    partial through the output rule (the splits race: wrong results by design, timing only), so
    a build's time minus this one's is its fixup's cost."""

    fixup: str = "skip"

    def __post_init__(self):
        super().__post_init__()
        if self.fixup not in SPLIT_FIXUPS:
            raise ValueError(f"fixup = {self.fixup!r}: choose from {SPLIT_FIXUPS}")
        if self.splits < 2:
            raise ValueError(f"splits = {self.splits}: a split-K fixup study needs >= 2")

    def key(self) -> tuple:
        return (*super().key(), "fixup", self.fixup)

    @cute.jit
    def _store_split(self, pairs, ops, tile, M: Int32, N2: Int32, splits):
        self._store_direct(pairs, ops, tile, M, N2)


@dsl_user_op
def _st_global_v4_f32(ptr, words, *, loc=None, ip=None) -> None:
    """``st.global.v4.f32`` of four fp32 partials at 16-byte aligned ``ptr`` (a weak store: the
    fence and the counter's release order it before the last CTA's reads)."""
    _asm_effect(None, [_gaddr(ptr, loc, ip)] + [Float32(w).ir_value(loc=loc, ip=ip)
                                                for w in words],
                "st.global.v4.f32 [$0], {$1, $2, $3, $4};", "l,f,f,f,f", loc, ip)


@dsl_user_op
def _ld_relaxed_gpu_v4_f32(ptr, *, loc=None, ip=None) -> list:
    """``ld.relaxed.gpu.global.v4.f32``: four partials another CTA wrote in this launch
    (coherent at L2, never a stale L1 line), read after the counter's acquire."""
    res = _asm_effect(llvm.StructType.get_literal([T.f32()] * 4), [_gaddr(ptr, loc, ip)],
                      "ld.relaxed.gpu.global.v4.f32 {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,l",
                      loc, ip)
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4)]
