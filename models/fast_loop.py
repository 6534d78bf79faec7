"""The fast depth loop: the baseline a fused frame must beat (issue #5).

Same semantics as :func:`models.codepredictor.depth_loop` (codes equal under teacher forcing,
logits within bf16 noise), restructured for speed:

* pre-projected embedding tables: P·E[i][g] + b is a row gather from a [vocab, 1024] table
  computed once, not a 2048 -> 1024 GEMV per step (and the same for the Talker's E_t[g0]);
* fused projections: one [4096, 1024] QKV weight and one [6144, 1024] gate/up weight per layer;
* a static KV cache [layers, R, kv_heads, 16, head_dim] written in place at the position, with
  attention over all 16 slots under a position mask, so every step has the same shapes;
* one position per pass: the reference's pass 0 (positions 0 and 1 together) becomes two
  single-position passes, which is the same causal computation (one extra weight read per frame,
  1/15 more traffic, in exchange for a single compiled step);
* the CuTe DSL small-M GEMV (kernels/depth/gemv_small_m.py) for every projection at <= 8 rows;
* ``torch.compile`` of the per-position step (RMSNorm, q/k norm, RoPE, KV append, attention,
  SwiGLU fused into Triton kernels around cuBLAS GEMMs) and of the draw (Philox, Gumbel, argmax,
  top-k by ``topk`` instead of a full sort);
* the whole frame captured as one CUDA graph per row bucket (1, 2, 4, ..., 128).

On the GPU the default path is ``kernels`` at 1-128 rows (measured faster than ``compiled`` at
every bucket since v8, the cluster split-K projections). For <= GEMV_MAX_ROWS rows: five CuTe DSL
kernels per layer (RMSNorm + QKV GEMV; q/k norm + RoPE + KV append + attention; o GEMV +
residual; RMSNorm + gate/up GEMV + SwiGLU; down GEMV + residual), then per drawn group a
final-norm + head GEMV and a one-CTA-per-row draw that also gathers the next input rows, all
launched with programmatic dependent launch so each kernel's weight stream starts under its
predecessor's tail (kernels/depth/gemv_small_m.py, depth_attention.py, depth_sampler.py). Above that the
rows are padded to a multiple of 16 (padding rows are zeros, drawn greedily, and dropped) and
each normed projection becomes a row-norm kernel plus a split-K tensor-core projection
(kernels/depth/rows_rmsnorm.py, gemm_skinny.py) with the same epilogues; per bucket (``FRAME_MMA``)
some projections run wgmma instead of mma.sync (gemm_skinny_wgmma.py, gemm_skinny_rwgmma.py);
``fold_norm`` (off) folds the row norms into the projections instead. Two structural
shortcuts keep the same bits: positions 0 and 1 run side by side on two streams (``prefill``),
and from position 2 on the draw gathers layer 0's QKV rows from a per-code table
(``qkv_table``). On a CPU (tests) everything runs eagerly.
"""
from __future__ import annotations

import torch

from models.codepredictor import (CodePredictorWeights, LoopOutput, rms_norm, rope_tables,
                                  rotate_half)
from models.sampler import Sampler, draw, filtered_scores

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
KERNELS_PATH_MAX_ROWS = 128  # the default path above this is ``compiled`` (see FastLoop)
# the kernels path runs the fused GEMVs up to this many rows and pads more rows to a multiple of
# 16 for the tensor-core projections: the GEMV frame grows ~0.29 ms a row (1.43 ms at 1 row, 3.45
# at 8) and the 16-row tensor-core frame takes 1.85 ms (results/depth-loop.json, 4332d31)
GEMV_MAX_ROWS = 2


def kernel_rows(rows: int) -> int:
    """Rows the kernels path computes for a ``rows``-row frame (padding rows are dropped)."""
    return rows if rows <= GEMV_MAX_ROWS else -(-rows // 16) * 16


def projection_shapes(cfg) -> list:
    """(output columns N, K, SwiGLU) of every projection of a position: QKV, o, gate/up (N =
    intermediate, from 2N weight rows), down, a head."""
    D, H, I = cfg.head_dim, cfg.hidden, cfg.intermediate
    return [((cfg.q_heads + 2 * cfg.kv_heads) * D, H, False), (H, cfg.q_heads * D, False),
            (I, H, True), (H, I, False), (cfg.vocab, H, False)]


PROJECTIONS = ("qkv", "wo", "gate_up", "down", "heads")
# kernel rows of a one-chain frame -> mma.sync tiles that beat the skinny GEMM's own defaults in
# the same-run frame A/B on the H200 (results/logs/612b67d-ab-*.log; three builds each in
# 50faf82-ab-instances-64.log): at 64 rows gate/up in 2 K-slices of 2 stages, 2543 -> 2464 µs,
# and the heads in 8-warp tiles of two warps a weight group, 2 stages, -> 2439 µs (gate/up's
# lost at 16, 32 and 128 rows, the heads' at 32 and 128); then qkv in 2 K-slices of two warps
# a group, 2352 -> 2315 µs (4fab9d1-ab-qkv-64.log). Used where these run on mma.sync.
FRAME_TILES = {64: {"gate_up": {"splits": 2, "a_stages": 2},
                    "heads": {"warps": 8, "m_split": 2, "a_stages": 2},
                    "qkv": {"splits": 2, "m_split": 2}}}
# the same for the register-A wgmma (FRAME_MMA): gate/up's a slice in 4 stages, 2085 -> 2067
# (6f29f92-ab-rwgmma-tiles-64.log); with TMA (v12, two builds each) gate/up in 8 stages and the
# heads on rwgmma_tma in 2 K-slices of 8 stages: 2031 -> 2008 together with input_proj
# (0c0c266-ab-v12b-64.log, 6084099-ab-v12c-64.log)
RWGMMA_TILES = {64: {"gate_up": {"splits": 2, "a_stages": 8},
                     "heads": {"splits": 2, "a_stages": 8},
                     "qkv": {"splits": 2, "m_split": 2}}}
# kernel rows -> FastLoop's default ``input_proj`` (v12: the skinny GEMM at 64 rows, -2 / -3 µs
# in two runs; not measured elsewhere)
FRAME_INPUT_PROJ = {64: "skinny"}


# kernel rows of a frame -> the projections' mainloops by default (FastLoop ``mma``, mainloops):
# down on the shared-memory wgmma at 64 rows, 2251 -> 2179 µs, and at 128 rows (two 64-row
# parts), 3239 -> 3216; lost at 32 (+11), even at 16 (feceb4d-ab-wgmma-*.log; v10k's loss at 64
# rows came from crowding the 256-CTA qkv after it, which the gathered QKV rows and the 2-slice
# qkv tile removed). gate/up and qkv on the register-A wgmma (v11a): 64 rows 2182 -> 2060 (with
# gate/up's 4 stages, two builds each), 32 rows 1834 -> 1762, 128 rows 3213 -> 3040; 16 rows
# level (3b1235f-ab-rwgmma-*.log); o and the heads lost or were level with chunk-major inputs
# (179111d-ab-rwgmma-64.log). At 64 rows gate/up, qkv and o with their row-major inputs by TMA
# (v11e): 2060 -> 2016, without o 2044 (1f3986c-ab-rwgmma-tma-64.log); not measured elsewhere;
# the heads too (v12a/b: -10, -13 with their tile; 5f5af78-ab-v12a-64.log, 0c0c266-ab-v12b-64.log)
_RWGMMA = {"gate_up": "rwgmma", "qkv": "rwgmma"}
FRAME_MMA = {32: dict(_RWGMMA), 64: {"down": "wgmma", "gate_up": "rwgmma_tma",
                                     "qkv": "rwgmma_tma", "wo": "rwgmma_tma",
                                     "heads": "rwgmma_tma"},
             128: {"down": "wgmma", **_RWGMMA}}


def frame_mma(rows: int, path: str, fold_norm=False):
    """FastLoop's default ``mma`` for a ``rows``-row loop: (a copy of) the bucket's
    ``FRAME_MMA`` on the kernels path without fold_norm, else "sync"."""
    if path != "kernels" or fold_norm:
        return "sync"
    return dict(FRAME_MMA.get(kernel_rows(rows), {})) or "sync"


def frame_tiles(run_rows: int, kinds: dict | None = None) -> dict:
    """The measured tiles of a one-chain frame on ``run_rows`` kernel rows for the
    projections' mainloops ``kinds`` (``mainloops``; absent: mma.sync): ``FRAME_TILES`` on
    mma.sync, ``RWGMMA_TILES`` on the register-A wgmma, none on the shared-memory wgmma; {}
    where none were measured faster."""
    out = {}
    for name in PROJECTIONS:
        kind = (kinds or {}).get(name, "sync")
        table = RWGMMA_TILES if kind.startswith("rwgmma") else \
            FRAME_TILES if kind == "sync" else {}
        if name in table.get(run_rows, {}):
            out[name] = dict(table[run_rows][name])
    return out


def checked_tiles(tiles: dict) -> dict:
    """FastLoop's ``tiles`` -> a copy, after checking it maps projections to keyword dicts."""
    if not isinstance(tiles, dict) or not all(isinstance(t, dict) for t in tiles.values()):
        raise ValueError(f"tiles {tiles!r}: a dict of projection -> dict of GEMM keywords, "
                         "e.g. {'qkv': {'warps': 8}}")
    unknown = set(tiles) - set(PROJECTIONS)
    if unknown:
        raise ValueError(f"tiles: unknown projections {sorted(unknown)}; take {PROJECTIONS}")
    return {name: dict(tile) for name, tile in tiles.items()}


# gemm_skinny, gemm_skinny_wgmma, gemm_skinny_rwgmma with its a_copy "bulk" / "tma"
MAINLOOPS = ("sync", "wgmma", "rwgmma", "rwgmma_tma")


def mainloops(mma) -> dict:
    """FastLoop's ``mma`` -> {projection: mainloop} for the projections not on mma.sync: a
    dict names each one's ("wgmma": shared-memory operands, kernels/depth/gemm_skinny_wgmma.py;
    "rwgmma": weights in registers, kernels/depth/gemm_skinny_rwgmma.py, its input chunk-major;
    "rwgmma_tma": the same with a row-major input brought by TMA; "sync"), anything else is
    :func:`wgmma_projections`' (all on "wgmma")."""
    if not isinstance(mma, dict):
        return {name: "wgmma" for name in wgmma_projections(mma)}
    unknown = set(mma) - set(PROJECTIONS)
    bad = {k: v for k, v in mma.items() if v not in MAINLOOPS}
    if unknown or bad:
        raise ValueError(f"mma {mma!r}: projections of {PROJECTIONS} -> one of {MAINLOOPS}")
    return {name: kind for name, kind in mma.items() if kind != "sync"}


def wgmma_projections(mma) -> frozenset:
    """FastLoop's ``mma`` -> the projections on the wgmma mainloop: "sync" none, "wgmma" all,
    else the names given (a tuple / list / set of PROJECTIONS)."""
    if isinstance(mma, str):
        if mma not in ("sync", "wgmma"):
            raise ValueError(f"mma {mma!r}: 'sync', 'wgmma' or a tuple of projections")
        return frozenset(PROJECTIONS if mma == "wgmma" else ())
    names = frozenset(mma)
    if not names <= set(PROJECTIONS):
        raise ValueError(f"mma: unknown projections {sorted(names - set(PROJECTIONS))}; "
                         f"take {PROJECTIONS}")
    return names


def default_parts(rows: int) -> tuple:
    """The kernels path's row parts: two chains, 64 rows and the rest, above 112 rows (one
    128-row chain 4389 µs, two 64-row chains on two streams 3714: notes/fast-loop.md v10l);
    else one chain, ``()``."""
    return (64, rows - 64) if kernel_rows(rows) == 128 else ()


def check_parts(parts: tuple, rows: int, path: str) -> tuple:
    """``parts`` validated for a ``rows``-row loop on ``path``; one part means one chain, ()."""
    if not parts:
        return ()
    if path != "kernels":
        raise ValueError(f"parts {parts}: only the kernels path splits rows")
    if sum(parts) != rows or min(parts) < 1 or any(r % 16 for r in parts[:-1]):
        raise ValueError(f"parts {parts}: row counts adding up to {rows}, all but the last a "
                         "multiple of 16")
    return tuple(parts) if len(parts) > 1 else ()


def bucket_for(rows: int) -> int:
    for b in BUCKETS:
        if rows <= b:
            return b
    raise ValueError(f"{rows} rows exceed the largest bucket ({BUCKETS[-1]})")


class FastWeights:
    """Weights rearranged for the fast loop (built once from CodePredictorWeights)."""

    def __init__(self, w: CodePredictorWeights):
        cfg = w.config
        self.config = cfg
        self.qkv = [torch.cat([lw.wq, lw.wk, lw.wv], 0).contiguous() for lw in w.layers]
        self.gate_up = [torch.cat([lw.gate, lw.up], 0).contiguous() for lw in w.layers]
        self.wo = [lw.wo for lw in w.layers]
        self.down = [lw.down for lw in w.layers]
        self.in_norm = [lw.in_norm for lw in w.layers]
        self.post_norm = [lw.post_norm for lw in w.layers]
        self.q_norm = [lw.q_norm for lw in w.layers]
        self.k_norm = [lw.k_norm for lw in w.layers]
        self.final_norm = w.final_norm
        self.proj_w, self.proj_b = w.proj_w, w.proj_b
        self.embed_proj = torch.stack([e @ w.proj_w.T + w.proj_b for e in w.embeds])
        self.talker_embed_proj = w.talker_embed @ w.proj_w.T + w.proj_b
        self.embeds = torch.stack(w.embeds)  # raw Talker-space rows for the Talker sum
        self.talker_embed = w.talker_embed
        self.heads = w.heads
        dev, dt = w.final_norm.device, w.final_norm.dtype
        cos, sin = rope_tables(cfg, torch.arange(cfg.positions, device=dev), dt, dev)
        self.cos, self.sin = cos, sin  # [16, head_dim]
        self._skinny = {}
        self.layer0_tables = {}  # FastLoop._layer0_qkv_table's, by the loop's configuration

    def skinny_weights(self, fold_norm: bool = False) -> dict:
        """The projections packed for kernels/depth/gemm_skinny.py (built once, shared by the loops of
        all buckets): lists ``qkv``, ``wo``, ``gate_up``, ``down`` per layer, ``heads``. With
        ``fold_norm`` the projections that follow a row norm (qkv, gate_up, heads) carry its
        gamma (kernels.depth.gemm_skinny.fold_gamma); wo and down are shared with the plain set."""
        if fold_norm not in self._skinny:
            from kernels.depth.gemm_skinny import fold_gamma, pack_weights

            plain = self._skinny.get(False)
            if plain is None:
                plain = {name: [pack_weights(t, swiglu=name == "gate_up")
                                for t in self.projection(name)] for name in PROJECTIONS}
                self._skinny[False] = plain
            if fold_norm:
                gammas = {"qkv": self.in_norm, "gate_up": self.post_norm,
                          "heads": [self.final_norm] * len(self.heads)}
                folded = {name: [pack_weights(fold_gamma(t, gm), swiglu=name == "gate_up")
                                 for t, gm in zip(self.projection(name), gammas[name])]
                          for name in gammas}
                self._skinny[True] = {**plain, **folded}
        return self._skinny[fold_norm]

    def projection(self, name: str) -> list:
        """Projection ``name``'s unpacked weights: one a layer ("qkv", "wo", "gate_up",
        "down"), one a drawn group ("heads")."""
        return {"qkv": self.qkv, "wo": self.wo, "gate_up": self.gate_up, "down": self.down,
                "heads": self.heads}[name]

    def input_proj_weights(self):
        """The Talker-state projection (proj_w) packed for kernels/depth/gemm_skinny.py (built
        once)."""
        if "input_proj" not in self._skinny:
            from kernels.depth.gemm_skinny import pack_weights

            self._skinny["input_proj"] = pack_weights(self.proj_w)
        return self._skinny["input_proj"]

    def rwgmma_weights(self, name: str) -> list:
        """Projection ``name`` packed for kernels/depth/gemm_skinny_rwgmma.py (built once)."""
        key = ("rwgmma", name)
        if key not in self._skinny:
            from kernels.depth.gemm_skinny_rwgmma import pack_weights_rwgmma

            self._skinny[key] = [pack_weights_rwgmma(t, name == "gate_up")
                                 for t in self.projection(name)]
        return self._skinny[key]

    def wgmma_weights(self, name: str, warps: int) -> list:
        """Projection ``name`` ("qkv", "wo", "gate_up", "down": per layer; "heads") packed for
        kernels/depth/gemm_skinny_wgmma.py with tiles of ``warps`` (built once per pair)."""
        key = ("wgmma", name, warps)
        if key not in self._skinny:
            from kernels.depth.gemm_skinny_wgmma import pack_weights_wgmma

            self._skinny[key] = [pack_weights_wgmma(t, name == "gate_up", warps)
                                 for t in self.projection(name)]
        return self._skinny[key]


def _mm(a, w, small_m: bool):
    """a @ w.T: the small-M CuTe DSL GEMV (kernels/depth/gemv_small_m.py) for <= 8 rows on CUDA."""
    if small_m:
        return torch.ops.wb.gemv_small_m(a, w)
    return a @ w.T


def position_step(x, pos, k_cache, v_cache, fw_lists, cos, sin, final_norm, cfg_tuple,
                  small_m: bool = False):
    """All layers for one position: x [R, hidden] -> (x, final-normed x). Writes K/V at ``pos``
    (int64 [1]) into the caches [layers, R, kv_heads, 16, head_dim]."""
    qkv_w, wo, gate_up, down, in_norm, post_norm, q_norm, k_norm = fw_lists
    q_heads, kv_heads, head_dim, eps, inter = cfg_tuple
    R = x.shape[0]
    slots = k_cache.shape[3]
    c = cos.index_select(0, pos).view(1, 1, head_dim)
    s = sin.index_select(0, pos).view(1, 1, head_dim)
    valid = (torch.arange(slots, device=x.device) <= pos).view(1, 1, 1, slots)
    rep = q_heads // kv_heads
    for li in range(len(qkv_w)):
        a = rms_norm(x, in_norm[li], eps)
        qkv = _mm(a, qkv_w[li], small_m)
        q = qkv[:, : q_heads * head_dim].view(R, q_heads, head_dim)
        k = qkv[:, q_heads * head_dim: (q_heads + kv_heads) * head_dim].view(R, kv_heads, head_dim)
        v = qkv[:, (q_heads + kv_heads) * head_dim:].view(R, kv_heads, head_dim)
        q = rms_norm(q, q_norm[li], eps)
        k = rms_norm(k, k_norm[li], eps)
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        k_cache[li].index_copy_(2, pos, k.view(R, kv_heads, 1, head_dim))
        v_cache[li].index_copy_(2, pos, v.view(R, kv_heads, 1, head_dim))
        # 16 slots x 128: products and sums written out so the compiler fuses them (as matmuls
        # they were ~160 tiny cuBLAS calls per frame); fp32 throughout, as the reference
        K = k_cache[li].to(torch.float32).unsqueeze(2)  # [R, kv, 1, slots, d]
        qg = q.view(R, kv_heads, rep, 1, head_dim).to(torch.float32)
        scores = (qg * K).sum(-1) * head_dim ** -0.5  # [R, kv, rep, slots]
        scores = scores.masked_fill(~valid, float("-inf"))
        p = torch.softmax(scores, dim=-1).to(x.dtype).to(torch.float32)
        V = v_cache[li].to(torch.float32).unsqueeze(2)  # [R, kv, 1, slots, d]
        attn = (p.unsqueeze(-1) * V).sum(3).to(x.dtype).reshape(R, q_heads * head_dim)
        x = x + _mm(attn, wo[li], small_m)
        a = rms_norm(x, post_norm[li], eps)
        gu = _mm(a, gate_up[li], small_m)
        x = x + _mm(torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:], down[li], small_m)
    return x, rms_norm(x, final_norm, eps)


def draw_topk(logits, temperature, top_k, seed, offset, kmax: int):
    """The reference sampler's draw (T, top-k with ties, Philox Gumbel-max; top-p off) with the
    k-th value taken from ``topk(kmax)``: the same value as the full sort, so the same codes."""
    s = filtered_scores(logits, temperature, top_k, kmax=kmax)
    return draw(s, temperature, seed, offset)


PREFILL = ("serial", "overlap")


class ChainBuffers:
    """One position chain's activations on the kernels path: the residual rows ``x``, their
    normalised copy ``xn`` and per-32-column sums of squares ``x_ss`` (tensor-core path only),
    and the QKV, attention and SwiGLU outputs."""

    def __init__(self, cfg, rows: int, device, dtype, tensor_core: bool):
        self.x = torch.zeros(rows, cfg.hidden, device=device, dtype=dtype)
        if tensor_core:  # the tensor-core projections take a normalised copy
            self.xn = torch.zeros_like(self.x)
            # x's sums of squares per 32 columns [hidden / 32, rows] (fold_norm="producer")
            self.x_ss = torch.zeros(cfg.hidden // 32, rows, device=device)
        self.qkv_out = torch.zeros(rows, (cfg.q_heads + 2 * cfg.kv_heads) * cfg.head_dim,
                                   device=device, dtype=dtype)
        self.attn = torch.zeros(rows, cfg.q_heads * cfg.head_dim, device=device, dtype=dtype)
        self.mlp = torch.zeros(rows, cfg.intermediate, device=device, dtype=dtype)


class FastLoop:
    """One frame for a fixed row bucket; ``compile`` and ``graph`` on a CUDA device.

    ``sampler``: a :class:`Sampler` whose ``fused_draw_args()`` is not None and whose top-p is
    off, or None for greedy. Call with (h [R, talker_hidden], g0 [R]) and optionally ``codes``
    [R, 15] (teacher forcing; only when built with ``teacher_forced=True``). ``tiles``: per
    projection ("qkv", "wo", "gate_up", "down", "heads"), keyword arguments for the skinny
    GEMM (``warps``, ``splits``, ``m_split``, ``a_stages``) instead of its defaults, for
    same-run A/B tests of the frame; None: the bucket's measured tiles (``FRAME_TILES``) on
    the kernels path of a one-chain frame without fold_norm, else the GEMM's defaults.
    ``fold_norm``: above GEMV_MAX_ROWS rows, no row-norm kernels (gamma folded into the weights
    of the projection that follows, which scales its rows: kernels.depth.gemm_skinny ``rms_eps``),
    the factors from that projection's own squares of its slices ("own") or from the sums of
    squares the residual projections wrote beside x ("producer"; layer 0 of a position, whose x
    comes from the draw, uses its own). ``mma``: "sync", "wgmma", or the names of
    the projections (a tuple) that above GEMV_MAX_ROWS rows run on kernels/depth/gemm_skinny_wgmma.py
    ("wgmma": all five; 4-warp tiles unless ``tiles`` says otherwise), or a dict naming each
    projection's mainloop (:func:`mainloops`: "rwgmma" is kernels/depth/gemm_skinny_rwgmma.py, wgmma
    with the weights in registers, on mma.sync's tiles); their producers (the norm, attention,
    gate/up) then write those inputs chunk-major, except for "rwgmma_tma" (TMA reads them
    row-major); None: the bucket's ``FRAME_MMA`` on the kernels path without fold_norm, else
    "sync".
    ``draw_noise``: where the draws' Gumbel terms are drawn (kernels.depth.draw NOISE; the
    same codes); default "early" on the tensor-core path, "compact" on the GEMVs' (whose draw
    CTA is released too soon to hide them: notes/fast-loop.md v10q). ``draw_norm``: above
    GEMV_MAX_ROWS rows without fold_norm or a wgmma qkv, each draw also writes the next
    position's first row norm (the same bits as the norm kernel it replaces). ``draw_trace``:
    the kernels path keeps each draw's %globaltimer stamps in ``draw_traces`` [15, run rows,
    len(DRAW_TRACE_POINTS)] (scripts/trace_frame.py); ``attn_trace``: each attention CTA's in
    ``attn_traces`` [positions, layers, run rows, kv heads, len(ATTN_TRACE_POINTS)]
    (scripts/trace_frame.py --kernel attention).
    ``prefill``: the kernels path's positions 0 and 1 (both inputs are known when the frame
    starts) "serial", or "overlap" (the kernels path's default): position 0's chain on a
    second stream with its own activations, position 1's attention of a layer waiting only
    for position 0's cache append of that layer (the same bits). Either way position 0's last
    layer stops after its cache append: nothing reads that position's output.
    ``qkv_table`` (default on the kernels path): layer 0's QKV rows of positions 2-15 are not
    projected but gathered by the draw from a table of every code's (``_layer0_qkv_table``: 14
    x vocab x 4096 bf16, 235 MB, built once per bucket configuration by this loop's own
    kernels, so the same bits): a position's input is a row of a pre-projected embedding
    table, so its first norm and QKV are functions of the code alone.
    ``input_proj``: position 0's input, h · proj_w^T + proj_b rounded twice as the reference
    does, by "torch" (a cuBLAS GEMM, then the bias add) or, on the tensor-core kernels path,
    "skinny" (kernels/depth/gemm_skinny.py with the bias rows as its residual: one PDL kernel);
    default the bucket's ``FRAME_INPUT_PROJ`` on a one-chain kernels path, else "torch".
    ``side_copies`` (default on; with ``prefill="overlap"``): the talker sum's slot 0 (the
    gather of ``g0``'s embedding), the fp32 sum of its first 15 slots (during the last
    position) and the sampler's offset advance run on position 0's stream, off position 1's
    chain and off the frame's tail (the same bits; off: in the main stream's order, for A/Bs).
    On the kernels path the talker sum is that fp32 partial sum plus the last slot, rounded
    once, written by the last draw (no 16-slot reduction on the tail): the reference's contract
    (fp32 accumulation, one rounding), its last slot added last rather than in torch's order,
    so an element may differ from the reference's ``sum(1)`` in its last bit.
    ``draw_advance`` (default on): on the kernels path the frame's last draw also advances the
    sampler's offsets (no offset kernel on the tail; not with padded rows, whose draws read
    copies of the sampler's tensors); off: ``Sampler.advance_offsets`` after the last draw.
    ``gemv_x``: how the GEMVs (<= GEMV_MAX_ROWS rows) without a norm prologue (o, down) bring
    in x: kernels.depth.gemv_small_m.X_COPIES, "async" by default (the same bits).
    ``parts``: on the kernels path, the rows split into parts (row counts in order, all but the
    last a multiple of 16), each part an eager FastLoop of its own on its own stream, writing
    into this loop's outputs; the streams fork and join inside the one captured frame. Default
    ``default_parts`` (two 64-row chains at 128 rows); ``()`` for one chain.
    """

    def __init__(self, fw: FastWeights, rows: int, sampler: Sampler | None = None, *,
                 compile: bool | None = None, graph: bool | None = None,
                 teacher_forced: bool = False, small_m: bool = True, path: str | None = None,
                 pdl: bool = True, tiles: dict | None = None, fold_norm: str | bool = False,
                 mma=None, parts: tuple | None = None, draw_noise: str | None = None,
                 draw_norm: bool = True, draw_trace: bool = False, attn_trace: bool = False,
                 prefill: str | None = None, qkv_table: bool | None = None,
                 input_proj: str | None = None, side_copies: bool = True,
                 draw_advance: bool = True, gemv_x: str = "async"):
        cfg = fw.config
        dev = fw.final_norm.device
        cuda = dev.type == "cuda"
        self.fw, self.rows, self.sampler, self.cfg = fw, rows, sampler, cfg
        self.teacher_forced = teacher_forced
        self.gemv_x = gemv_x
        self.pdl = pdl  # kernels path: programmatic dependent launch (off: plain stream order)
        self.tiles = checked_tiles(tiles or {})
        # kernels path above GEMV_MAX_ROWS: no row-norm kernels; the projection after a norm
        # scales its rows by the norm's factor with gamma folded into its weights (off: faster
        # only at 16 rows, and it drops the reference's rounding; notes/fast-loop.md v10b/v10d)
        if fold_norm not in (False, "own", "producer"):
            raise ValueError(f"fold_norm {fold_norm!r}: False, 'own' or 'producer'")
        self.fold_norm = fold_norm
        if sampler is not None:
            args = sampler.fused_draw_args()
            if args is None or sampler.uses["top_p"]:
                raise ValueError("the fast loop draws T / top-k only: this sampler needs the plain "
                                 "path (penalty, min-p, top-p, logprobs, eager or CPU)")
            self.kmax = int(sampler.top_k.max().item()) or cfg.vocab
            self.kmax = min(self.kmax, cfg.vocab)
        # the CuTe DSL small-M GEMV for <= 8 rows on the GPU (cuBLAS streams these weights at
        # 0.4-1.6 TB/s); cuBLAS above, and everywhere on a CPU
        self.small_m = cuda and rows <= 8 and small_m
        kernels_ok = cuda and 1 <= rows <= 128
        # default per bucket from the H200 figures: the kernels path wins at every bucket since
        # v8 (results/depth-loop.json, ff5803d: 1.43-4.62 ms vs compiled 3.89-8.99 ms)
        default_kernels = kernels_ok and rows <= KERNELS_PATH_MAX_ROWS
        self.path = path or ("kernels" if default_kernels else "compiled")
        if self.path not in ("kernels", "compiled"):
            raise ValueError(f"path {path!r}: 'kernels' or 'compiled'")
        if self.path == "kernels" and not kernels_ok:
            raise ValueError("the kernels path runs on a CUDA device with 1-128 rows")
        # position 0 beside position 1 won at every bucket measured (notes/fast-loop.md v10x)
        prefill = prefill or ("overlap" if self.path == "kernels" else "serial")
        # mma: the tensor-core projections' mainloop above GEMV_MAX_ROWS rows, per projection:
        # kernels/depth/gemm_skinny.py (mma.sync) or, for those in self.wgmma,
        # kernels/depth/gemm_skinny_wgmma.py (whose inputs xn / attn / mlp their producers then
        # write chunk-major); None: the bucket's measured choice (FRAME_MMA) on the kernels
        # path without fold_norm, else "sync"
        mma = frame_mma(rows, self.path, fold_norm) if mma is None else mma
        self.mma = mma
        kinds = mainloops(mma)
        self.wgmma = frozenset(n for n, k in kinds.items() if k == "wgmma")
        self.rwgmma = frozenset(n for n, k in kinds.items() if k.startswith("rwgmma"))
        self.tma_in = frozenset(n for n, k in kinds.items() if k == "rwgmma_tma")
        # the projections whose input their producer writes chunk-major (both wgmma kernels
        # bulk-copy it)
        self.chunk_in = self.wgmma | (self.rwgmma - self.tma_in)
        if self.chunk_in and fold_norm:
            raise ValueError(f"mma {mma!r}: the wgmma projections take no fold_norm")
        if prefill not in PREFILL or (prefill != "serial" and self.path != "kernels"):
            raise ValueError(f"prefill {prefill!r}: one of {PREFILL}, and 'serial' off the "
                             "kernels path")
        self.prefill = prefill
        if input_proj is None:  # the bucket's measured choice on a one-chain kernels path
            one_chain = self.path == "kernels" and not parts and not default_parts(rows)
            input_proj = FRAME_INPUT_PROJ.get(kernel_rows(rows), "torch") if one_chain \
                else "torch"
        if input_proj not in ("torch", "skinny") or (
                input_proj == "skinny" and (self.path != "kernels" or rows <= GEMV_MAX_ROWS)):
            raise ValueError(f"input_proj {input_proj!r}: 'torch', or 'skinny' on the kernels "
                             f"path above {GEMV_MAX_ROWS} rows")
        self.input_proj = input_proj
        self.side_copies = side_copies and prefill == "overlap"
        if qkv_table and self.path != "kernels":
            raise ValueError("qkv_table: the kernels path only")
        # the gathered QKV rows won at every bucket measured (notes/fast-loop.md v10y)
        self.qkv_table = self.path == "kernels" if qkv_table is None else qkv_table
        # rows the kernels run on: the GEMVs up to GEMV_MAX_ROWS, else a multiple of 16 for the
        # tensor-core projections; padding rows hold zeros and their results are dropped
        if parts is None:
            parts = default_parts(rows) if self.path == "kernels" else ()
        self.parts = check_parts(tuple(parts), rows, self.path)
        self.run_rows = (sum(kernel_rows(r) for r in self.parts) if self.parts else
                         kernel_rows(rows) if self.path == "kernels" else rows)
        P = self.run_rows
        if tiles is None and self.path == "kernels" and not self.parts and not fold_norm:
            # the measured tiles of this bucket (a part's loop is given its parent's: none)
            self.tiles = frame_tiles(P, kinds)
        dt = fw.final_norm.dtype
        L, H, D = cfg.layers, cfg.kv_heads, cfg.head_dim
        self.k_cache = torch.zeros(L, P, H, cfg.positions, D, device=dev, dtype=dt)
        self.v_cache = torch.zeros_like(self.k_cache)
        self.h = torch.zeros(P, cfg.talker_hidden, device=dev, dtype=dt)
        self.g0 = torch.zeros(P, dtype=torch.int64, device=dev)
        self.codes_in = torch.zeros(P, cfg.heads_drawn, dtype=torch.int64, device=dev)
        self.codes = torch.zeros(P, cfg.heads_drawn, dtype=torch.int64, device=dev)
        self.logits = torch.zeros(P, cfg.heads_drawn, cfg.vocab, device=dev)
        self.used = torch.zeros(P, cfg.groups, cfg.talker_hidden, device=dev, dtype=dt)
        self.talker_sum = torch.zeros(P, cfg.talker_hidden, device=dev, dtype=dt)
        self.positions = [torch.tensor([p], device=dev) for p in range(cfg.positions)]
        self.lists = (fw.qkv, fw.wo, fw.gate_up, fw.down, fw.in_norm, fw.post_norm, fw.q_norm,
                      fw.k_norm)
        self.cfg_tuple = (cfg.q_heads, cfg.kv_heads, cfg.head_dim, cfg.rms_eps, cfg.intermediate)
        self.part_loops = []
        if self.parts:  # the parts' loops: eager, on views of this loop's outputs
            part_kw = dict(compile=compile, graph=False, teacher_forced=teacher_forced,
                           small_m=small_m, path="kernels", pdl=pdl, tiles=self.tiles,
                           fold_norm=fold_norm, mma=mma, parts=(), draw_noise=draw_noise,
                           draw_norm=draw_norm, draw_trace=draw_trace, attn_trace=attn_trace,
                           prefill=prefill, qkv_table=qkv_table, input_proj=input_proj,
                           side_copies=side_copies, draw_advance=draw_advance, gemv_x=gemv_x)
            start = 0
            for r in self.parts:
                view = sampler.rows_view(start, start + r) if sampler is not None else None
                part = FastLoop(fw, r, view, **part_kw)
                part._write_into(self, start)
                self.part_loops.append(part)
                start += part.run_rows
            self.part_streams = [torch.cuda.Stream() for _ in self.parts]
        elif self.path == "kernels":
            # the main chain's activations, and position 0's when it runs beside position 1
            self.buf = ChainBuffers(cfg, P, dev, dt, P > GEMV_MAX_ROWS)
            self.buf0 = self.buf
            if prefill == "overlap":
                self.buf0 = ChainBuffers(cfg, P, dev, dt, P > GEMV_MAX_ROWS)
                self.prefill_stream = torch.cuda.Stream()
                # recorded after each layer's cache append at position 0; position 1's
                # attention of that layer waits for it
                self.cache_events = [torch.cuda.Event() for _ in range(L)]
                self.first_slots_done = torch.cuda.Event()  # side_copies: the sum waits
            # the talker sum's first 15 slots summed in fp32 before the last draw (see the notes)
            self.first_slots_sum = torch.zeros(P, cfg.talker_hidden, device=dev)
            # the draws write the next position's first normalised row (the GEMVs norm their
            # own rows; fold_norm has no norm kernels; a wgmma qkv reads xn chunk-major)
            self.draw_norm = (draw_norm and P > GEMV_MAX_ROWS and not fold_norm
                              and "qkv" not in self.chunk_in and not self.qkv_table)
            from kernels.depth.draw import NOISE
            from kernels.depth.gemv_small_m import X_COPIES

            if gemv_x not in X_COPIES:
                raise ValueError(f"gemv_x {gemv_x!r}: one of {X_COPIES}")
            if draw_noise not in (None, *NOISE):
                raise ValueError(f"draw_noise {draw_noise!r}: one of {NOISE} or None")
            self.draw_noise = draw_noise or ("early" if P > GEMV_MAX_ROWS else "compact")
            self.draw_traces = None
            if draw_trace:
                from kernels.depth.draw import DRAW_TRACE_POINTS

                self.draw_traces = torch.zeros(cfg.heads_drawn, P, len(DRAW_TRACE_POINTS),
                                               dtype=torch.int64, device=dev)
            self.attn_traces = None
            if attn_trace:
                from kernels.depth.attention import ATTN_TRACE_POINTS

                self.attn_traces = torch.zeros(cfg.positions, L, P, H, len(ATTN_TRACE_POINTS),
                                               dtype=torch.int64, device=dev)
            # the projections' weights as the kernels take them: plain for the GEMVs, packed for
            # the tensor-core projections
            self.kernel_w = self._packed_weights() if P > GEMV_MAX_ROWS else {
                "qkv": fw.qkv, "wo": fw.wo, "gate_up": fw.gate_up, "down": fw.down,
                "heads": fw.heads}
            # the draw's per-row parameters over the padded rows: the sampler's are copied in at
            # the start of each frame (padding rows draw greedily with seed 0)
            self.draw_params = None
            self.draw_advance = draw_advance and sampler is not None and P == rows
            if sampler is not None and P > rows:
                self.draw_params = {
                    "temperature": torch.ones(P, dtype=sampler.temperature.dtype, device=dev),
                    "top_k": torch.ones(P, dtype=sampler.top_k.dtype, device=dev),
                    "seed": torch.zeros(P, dtype=sampler.seed.dtype, device=dev),
                    "offset": torch.zeros(P, dtype=sampler.offset.dtype, device=dev)}
            self.layer0_qkv = self._layer0_qkv_table() if self.qkv_table else None
            if input_proj == "skinny":  # the bias as the projection's residual rows
                self.proj_bias_rows = fw.proj_b.expand(P, -1).contiguous()
        if self.small_m:
            from kernels.depth.gemv_small_m import register_torch_op

            register_torch_op()
        use_compile = cuda if compile is None else compile
        self.step = torch.compile(position_step) if use_compile else position_step
        self.draw = torch.compile(draw_topk) if use_compile else draw_topk
        self.graph = None
        if cuda if graph is None else graph:
            self._capture()

    def _write_into(self, whole: "FastLoop", start: int):
        """Take rows [start, start + run_rows) of ``whole``'s inputs and outputs as this loop's
        buffers (a part of a loop built with ``parts``)."""
        rows = slice(start, start + self.run_rows)
        for name in ("h", "g0", "codes_in", "codes", "logits", "used", "talker_sum"):
            setattr(self, name, getattr(whole, name)[rows])
        self.k_cache, self.v_cache = whole.k_cache[:, rows], whole.v_cache[:, rows]

    # ---- one frame, eagerly (also what the graph captures) -------------------------------------
    def _run_frame(self):
        if self.part_loops:  # each part on its own stream, forked from and joined to this one
            here = torch.cuda.current_stream()
            for stream, part in zip(self.part_streams, self.part_loops):
                stream.wait_stream(here)
                with torch.cuda.stream(stream):
                    part._run_frame()
            for stream in self.part_streams:
                here.wait_stream(stream)
        elif self.path == "kernels":
            self._frame_kernels()
        else:
            self._frame()

    def _frame(self):
        fw, cfg = self.fw, self.cfg
        x0 = self.h @ fw.proj_w.T + fw.proj_b
        e0 = fw.talker_embed.index_select(0, self.g0)
        self.used[:, 0].copy_(e0)
        inputs = [x0, fw.talker_embed_proj.index_select(0, self.g0)]
        g = self.g0  # the code drawn at the previous position (set from position 1 on)
        for p in range(cfg.positions):
            x = inputs[p] if p < 2 else fw.embed_proj[p - 2].index_select(0, g)
            _, normed = self.step(x, self.positions[p], self.k_cache, self.v_cache, self.lists,
                                  fw.cos, fw.sin, fw.final_norm, self.cfg_tuple, self.small_m)
            if p == 0:
                continue
            s = p - 1  # this position predicts g_{s+1}
            logits = _mm(normed, fw.heads[s], self.small_m).to(torch.float32)
            self.logits[:, s].copy_(logits)
            if self.teacher_forced:
                g = self.codes_in[:, s]
            elif self.sampler is not None:
                smp = self.sampler
                g = self.draw(logits, smp.temperature, smp.top_k, smp.seed, smp.offset, self.kmax)
                smp.advance_offsets(1)
            else:
                g = torch.argmax(logits, dim=-1)
            self.codes[:, s].copy_(g)
            self.used[:, s + 1].copy_(fw.embeds[s].index_select(0, g))
        torch.sum(self.used, 1, out=self.talker_sum)  # no copy kernel after it

    def _project(self, name, a, w, out, buf: ChainBuffers, *, gamma=None, resid=None,
                 swiglu: bool = False, sums_ready: bool = True, normed: bool = False):
        """out = [resid +] [norm](a) · w^T [SwiGLU]: the fused GEMV for <= GEMV_MAX_ROWS rows,
        else the row norm (when gamma is given) and the split-K tensor-core projection (``w``
        then packed: FastWeights.skinny_weights). ``sums_ready``: a residual projection wrote
        a's sums of squares (``x_ss``; not so for layer 0, whose x comes from the draw).
        ``normed``: xn already holds norm(a) (the draw wrote it: ``draw_norm``). ``buf``: the
        chain's activations (its xn and x_ss)."""
        from kernels.depth.gemm_skinny import gemm_skinny
        from kernels.depth.gemv_small_m import gemv_small_m
        from kernels.depth.rows_rmsnorm import rows_rmsnorm

        eps = self.cfg.rms_eps
        if self.run_rows <= GEMV_MAX_ROWS:
            gemv_small_m(a, w, out, gamma=gamma, resid=resid, swiglu=swiglu, pdl=self.pdl,
                         eps=eps, x_copy=self.gemv_x)
            return
        folded = {}
        producer = self.fold_norm == "producer"
        if gamma is not None and self.fold_norm:  # gamma is in w (skinny_weights)
            folded = dict(rms_eps=eps)
            if producer and sums_ready:
                folded["ss_in"] = buf.x_ss
        elif gamma is not None and normed:
            a = buf.xn
        elif gamma is not None:
            a = rows_rmsnorm(a, gamma, buf.xn, eps=eps, pdl=self.pdl,
                             chunk_major=name in self.chunk_in)
        # gate/up's output is down's input: chunk-major when down runs on wgmma
        cm_out = dict(chunk_major_out=True) if name == "gate_up" and "down" in self.chunk_in \
            else {}
        if name in self.rwgmma:  # mma.sync's tiles; a chunk-major unless brought by TMA
            from kernels.depth.gemm_skinny_rwgmma import gemm_skinny_rwgmma

            gemm_skinny_rwgmma(a, w, out, resid=resid, swiglu=swiglu, pdl=self.pdl, **cm_out,
                               a_copy="tma" if name in self.tma_in else "bulk",
                               **self.tiles.get(name, {}))
            return
        if name in self.wgmma:  # a is chunk-major
            from kernels.depth.gemm_skinny_wgmma import WGMMA_WARPS, gemm_skinny_wgmma

            tile = {"warps": WGMMA_WARPS, **self.tiles.get(name, {})}
            gemm_skinny_wgmma(a, w, out, resid=resid, swiglu=swiglu, pdl=self.pdl, **cm_out,
                              **tile)
            return
        gemm_skinny(a, w, out, resid=resid, swiglu=swiglu, pdl=self.pdl,
                    **self.tiles.get(name, {}), **folded, **cm_out,
                    **(dict(ss_out=buf.x_ss) if producer and resid is not None else {}))

    def _packed_weights(self) -> dict:
        """The tensor-core projections' weights as their kernels take them: packed for
        mma.sync (the norm's gamma folded in with fold_norm) or, for the wgmma projections, for
        their tiles (``tiles`` warps, else WGMMA_WARPS)."""
        fw = self.fw
        packed = {} if self.wgmma | self.rwgmma == set(PROJECTIONS) else \
            dict(fw.skinny_weights(bool(self.fold_norm)))  # a copy: that dict is shared
        packed.update({name: fw.rwgmma_weights(name) for name in self.rwgmma})
        if self.wgmma:
            from kernels.depth.gemm_skinny_wgmma import WGMMA_WARPS

            packed = {**packed, **{name: fw.wgmma_weights(
                name, self.tiles.get(name, {}).get("warps", WGMMA_WARPS)) for name in self.wgmma}}
        return packed

    def _layer0_qkv_table(self) -> torch.Tensor:
        """[positions - 2, vocab, QKV width] bf16: for each draw that feeds a next position
        (0-13) and each code, layer 0's QKV output on that code's input row (``embed_proj``),
        computed as the frame computes it (this loop's ``_project``, its tiles and row count:
        a row's outputs do not depend on the other rows), so gathering it gives the same bits.
        Built once per (rows, qkv tile, fold_norm, mma) and kept on the FastWeights."""
        fw, cfg, P = self.fw, self.cfg, self.run_rows
        key = (P, tuple(sorted(self.tiles.get("qkv", {}).items())), self.fold_norm,
               mainloops(self.mma).get("qkv", "sync"))
        if key not in fw.layer0_tables:
            tmp = ChainBuffers(cfg, P, fw.final_norm.device, fw.final_norm.dtype,
                               P > GEMV_MAX_ROWS)
            V, width = cfg.vocab, tmp.qkv_out.shape[1]
            table = torch.empty(cfg.positions - 2, V, width, device=tmp.x.device,
                                dtype=tmp.x.dtype)
            for s in range(cfg.positions - 2):
                for c0 in range(0, V, P):
                    n = min(P, V - c0)
                    tmp.x.zero_()
                    tmp.x[:n].copy_(fw.embed_proj[s, c0:c0 + n])
                    self._project("qkv", tmp.x, self.kernel_w["qkv"][0], tmp.qkv_out, tmp,
                                  gamma=fw.in_norm[0], sums_ready=False)
                    table[s, c0:c0 + n].copy_(tmp.qkv_out[:n])
            fw.layer0_tables[key] = table
        return fw.layer0_tables[key]

    def _layer(self, p: int, li: int, buf: ChainBuffers, *, normed: bool = False,
               cache_wait=None, cache_done=None):
        """Layer ``li`` of position ``p`` on the chain's activations ``buf`` (x in place).
        ``cache_wait``: an event the attention waits for (position 0's cache append of this
        layer, when position 0 runs on its own stream); ``cache_done``: recorded after it.
        With ``qkv_table`` layer 0 from position 2 on starts at the attention (the draw wrote
        its QKV rows)."""
        from kernels.depth.attention import depth_attention

        fw, cfg, W, proj = self.fw, self.cfg, self.kernel_w, self._project
        if not (self.qkv_table and li == 0 and p >= 2):
            proj("qkv", buf.x, W["qkv"][li], buf.qkv_out, buf, gamma=fw.in_norm[li],
                 sums_ready=li > 0, normed=normed)
        if cache_wait is not None:
            torch.cuda.current_stream().wait_event(cache_wait)
        depth_attention(buf.qkv_out, fw.q_norm[li], fw.k_norm[li], fw.cos, fw.sin,
                        self.k_cache[li], self.v_cache[li], p, buf.attn,
                        q_heads=cfg.q_heads, kv_heads=cfg.kv_heads, eps=cfg.rms_eps,
                        pdl=self.pdl,
                        chunk_major="wo" in self.chunk_in and self.run_rows > GEMV_MAX_ROWS,
                        trace=None if self.attn_traces is None else self.attn_traces[p, li])
        if cache_done is not None:
            cache_done.record()
        if p == 0 and li == cfg.layers - 1:
            return  # nothing reads position 0's output: its last layer ends at the cache
        proj("wo", buf.attn, W["wo"][li], buf.x, buf, resid=buf.x)
        proj("gate_up", buf.x, W["gate_up"][li], buf.mlp, buf, gamma=fw.post_norm[li],
             swiglu=True)
        proj("down", buf.mlp, W["down"][li], buf.x, buf, resid=buf.x)

    def _frame_kernels(self):
        """The frame as CuTe DSL kernels; same buffers and semantics as _frame."""
        from kernels.depth.draw import depth_draw

        fw, cfg, buf = self.fw, self.cfg, self.buf
        overlap = self.prefill == "overlap"
        if self.input_proj == "skinny":  # bf16(b + bf16(h · W^T)), as torch rounds it
            from kernels.depth.gemm_skinny import gemm_skinny

            gemm_skinny(self.h, fw.input_proj_weights(), self.buf0.x, resid=self.proj_bias_rows,
                        pdl=self.pdl)
        else:
            torch.add(self.h @ fw.proj_w.T, fw.proj_b, out=self.buf0.x)
        here = torch.cuda.current_stream()
        if overlap:  # position 0 on its own stream, a cache append ahead of position 1
            side = self.prefill_stream
            side.wait_stream(here)
            with torch.cuda.stream(side):
                for li in range(cfg.layers):
                    self._layer(0, li, self.buf0, cache_done=self.cache_events[li])
                if self.side_copies:  # nothing but the talker sum reads slot 0
                    self.used[:, 0].copy_(fw.talker_embed.index_select(0, self.g0))
            # the last layer's event (or slot 0's) follows that stream's last kernel, so a
            # wait for it also rejoins the stream (as a capture requires)
        if not self.side_copies:
            self.used[:, 0].copy_(fw.talker_embed.index_select(0, self.g0))
        if cfg.heads_drawn < 2:  # slot 0 is all the partial sum holds
            self._sum_first_slots()
        smp = self.sampler
        mode = "forced" if self.teacher_forced else ("greedy" if smp is None else "sample")
        draw_args = {}
        if smp is not None and self.draw_params is None:
            draw_args = dict(temperature=smp.temperature, top_k=smp.top_k, seed=smp.seed,
                             offset=smp.offset)
        elif smp is not None:  # padded rows: this frame's parameters into the padded copies
            draw_args = self.draw_params
            for name, t in draw_args.items():
                t[:self.rows].copy_(getattr(smp, name))
        for p in range(1 if overlap else 0, cfg.positions):
            if p == 1:
                torch.index_select(fw.talker_embed_proj, 0, self.g0, out=buf.x)
            for li in range(cfg.layers):
                self._layer(p, li, buf, normed=li == 0 and p >= 2 and self.draw_norm,
                            cache_wait=self.cache_events[li] if overlap and p == 1 else None)
            if p == 0:
                continue
            s = p - 1  # this position predicts g_{s+1}
            self._project("heads", buf.x, self.kernel_w["heads"][s], self.logits[:, s], buf,
                          gamma=fw.final_norm)
            # the next position's first QKV rows or norm in the draw (none after the last)
            nxt = {}
            if self.qkv_table and p + 1 < cfg.positions:
                nxt = dict(qkv_table=self.layer0_qkv[s], qkv_next=buf.qkv_out)
            elif self.draw_norm and p + 1 < cfg.positions:
                nxt = dict(gamma=fw.in_norm[0], xn=buf.xn, eps=cfg.rms_eps)
            if s == cfg.heads_drawn - 1:  # the last draw ends the talker sum (no kernel after)
                if self.side_copies:
                    here.wait_event(self.first_slots_done)
                nxt = dict(sum_in=self.first_slots_sum, sum_out=self.talker_sum)
                if self.draw_advance:  # and the sampler's offsets (no kernel after it)
                    nxt["advance"] = cfg.heads_drawn
            depth_draw(self.logits[:, s], self.codes[:, s], fw.embed_proj[s], fw.embeds[s],
                       buf.x, self.used[:, s + 1], s, mode=mode, codes_in=self.codes_in[:, s],
                       pdl=self.pdl, noise=self.draw_noise,
                       trace=None if self.draw_traces is None else self.draw_traces[s],
                       **nxt, **draw_args)
            if s == cfg.heads_drawn - 2:  # every slot but the last is written
                self._sum_first_slots()
        if smp is not None and not self.draw_advance:
            if self.side_copies:  # off the tail, after the last draw's reads
                side.wait_stream(here)
                with torch.cuda.stream(side):
                    smp.advance_offsets(cfg.heads_drawn)
                here.wait_stream(side)
            else:
                smp.advance_offsets(cfg.heads_drawn)

    def _sum_first_slots(self):
        """The fp32 sum of the talker sum's slots but the last (``first_slots_sum``), to which
        the last draw adds its row: on position 0's stream with side_copies (the last draw
        waits for ``first_slots_done``), else in the main stream's order."""
        here = torch.cuda.current_stream()
        stream = self.prefill_stream if self.side_copies else here
        if self.side_copies:  # after the draw that wrote the second-to-last slot
            stream.wait_stream(here)
        with torch.cuda.stream(stream):
            torch.sum(self.used[:, :-1], 1, dtype=torch.float32, out=self.first_slots_sum)
            if self.side_copies:
                self.first_slots_done.record()

    def _capture(self):
        offset0 = self.sampler.offset.clone() if self.sampler is not None else None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # compile and warm up outside the graph
                self._run_frame()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._run_frame()
        if self.sampler is not None:
            self.sampler.offset.copy_(offset0)

    def __call__(self, h: torch.Tensor, g0: torch.Tensor, codes: torch.Tensor | None = None
                 ) -> LoopOutput:
        R = self.rows
        if h.shape[0] != R or g0.shape[0] != R:
            raise ValueError(f"this loop is for {R} rows, got h {tuple(h.shape)}, "
                             f"g0 {tuple(g0.shape)}")
        if (codes is not None) != self.teacher_forced:
            raise ValueError("pass codes exactly when the loop was built with teacher_forced=True")
        self.h[:R].copy_(h)
        self.g0[:R].copy_(g0)
        if codes is not None:
            self.codes_in[:R].copy_(codes)
        if self.graph is not None:
            self.graph.replay()
        else:
            self._run_frame()
        kv = [(self.k_cache[i, :R], self.v_cache[i, :R]) for i in range(self.cfg.layers)]
        return LoopOutput(self.codes[:R], self.talker_sum[:R], kv, self.logits[:R])
