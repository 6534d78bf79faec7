"""The fast depth loop (issue #5): one CodePredictor frame per call for a fixed row bucket.

Same semantics as :func:`models.codepredictor.depth_loop` (codes equal under teacher forcing,
logits within bf16 noise), restructured for speed:

* pre-projected embedding tables: P·E[i][g] + b is a row gather from a [vocab, 1024] table
  computed once, not a 2048 -> 1024 GEMV per step (and the same for the Talker's E_t[g0]);
* fused projections: one [4096, 1024] QKV weight and one [6144, 1024] gate/up weight per layer;
* a static KV cache [layers, R, kv_heads, 16, head_dim] written in place at the position, with
  attention over all 16 slots under a position mask, so every step has the same shapes;
* one position per pass: the reference's pass 0 (positions 0 and 1 together) becomes two
  single-position passes, the same causal computation.

On a CUDA device every frame runs CuTe DSL kernels chained by programmatic dependent launch and
is captured as one CUDA graph. What each row count runs with (kernel rows, parts, mainloops,
tiles, input projection, draw noise) is its plan, ``schedules.plan.frame_plan``. Up to
GEMV_MAX_ROWS rows a layer is four fused GEMVs (norm + QKV, o + residual, norm + gate/up +
SwiGLU, down + residual: kernels/depth/gemv_small_m.py) and the attention step
(kernels/depth/attention.py), a drawn group a final-norm + head GEMV and a one-CTA-per-row draw
(kernels/depth/draw.py) that also gathers the next input rows. Above that
the rows are padded to a multiple of 16 (zeros, drawn greedily, dropped) and each normed
projection is a row-norm kernel (kernels/depth/rows_rmsnorm.py) plus a split-K tensor-core
projection on the plan's mainloop (kernels/depth/gemm_skinny*.py). The frame's structure keeps
the bits of a plain position-by-position loop: position 0 runs on a second stream beside
position 1 (whose attention of a layer waits for position 0's cache append of it), from
position 2 on the draw gathers layer 0's QKV rows from a per-code table, and the last draw
ends the talker sum and advances the sampler's offsets. On a CPU (tests) a plain torch loop
runs eagerly.
"""
from __future__ import annotations

import hashlib
import logging

import torch

from configs.codepredictor import LoopOutput
from kernels.depth.attention import ATTN_TRACE_POINTS, depth_attention
from kernels.depth.draw import DRAW_TRACE_POINTS, depth_draw
from kernels.depth.frame import DepthFrame, FrameRefused, FrameUnsupported, sampler_refusal
from kernels.depth.gemm_skinny import gemm_skinny, pack_weights
from kernels.depth.gemm_skinny_rwgmma import gemm_skinny_rwgmma, pack_weights_rwgmma
from kernels.depth.gemm_skinny_wgmma import WGMMA_WARPS, gemm_skinny_wgmma, pack_weights_wgmma
from kernels.depth.gemv_small_m import gemv_small_m
from kernels.depth.rows_rmsnorm import rows_rmsnorm
from models.codepredictor import CodePredictorWeights, rms_norm, rope_tables, rotate_half
from models.sampler import Sampler, argmax_candidates, refuse_undrawable
from schedules.plan import PROJECTIONS, FramePlan, frame_kernel_dispatch, frame_plan
from workbench import WorkbenchError

log = logging.getLogger(__name__)


def projection_shapes(cfg) -> list:
    """(output columns N, K, SwiGLU) of every projection of a position: QKV, o, gate/up (N =
    intermediate, from 2N weight rows), down, a head."""
    D, H, I = cfg.head_dim, cfg.hidden, cfg.intermediate
    return [((cfg.q_heads + 2 * cfg.kv_heads) * D, H, False), (H, cfg.q_heads * D, False),
            (I, H, True), (H, I, False), (cfg.vocab, H, False)]


class FastWeights:
    """Weights rearranged for the fast loop (built once from CodePredictorWeights); the packed
    copies the kernels take are built on first use and shared by the loops of all buckets."""

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

    def skinny_weights(self) -> dict:
        """Every projection packed for kernels/depth/gemm_skinny.py (mma.sync): lists ``qkv``,
        ``wo``, ``gate_up``, ``down`` per layer, ``heads``."""
        if "sync" not in self._skinny:
            self._skinny["sync"] = {name: [pack_weights(t, swiglu=name == "gate_up")
                                           for t in self.projection(name)]
                                    for name in PROJECTIONS}
        return self._skinny["sync"]

    def projection(self, name: str) -> list:
        """Projection ``name``'s unpacked weights: one a layer ("qkv", "wo", "gate_up",
        "down"), one a drawn group ("heads")."""
        return {"qkv": self.qkv, "wo": self.wo, "gate_up": self.gate_up, "down": self.down,
                "heads": self.heads}[name]

    def input_proj_weights(self):
        """The Talker-state projection (proj_w) packed for kernels/depth/gemm_skinny.py."""
        if "input_proj" not in self._skinny:
            self._skinny["input_proj"] = pack_weights(self.proj_w)
        return self._skinny["input_proj"]

    def rwgmma_weights(self, name: str) -> list:
        """Projection ``name`` packed for kernels/depth/gemm_skinny_rwgmma.py."""
        key = ("rwgmma", name)
        if key not in self._skinny:
            self._skinny[key] = [pack_weights_rwgmma(t, name == "gate_up")
                                 for t in self.projection(name)]
        return self._skinny[key]

    def wgmma_weights(self, name: str, warps: int) -> list:
        """Projection ``name`` packed for kernels/depth/gemm_skinny_wgmma.py with tiles of
        ``warps`` (one packing per pair)."""
        key = ("wgmma", name, warps)
        if key not in self._skinny:
            self._skinny[key] = [pack_weights_wgmma(t, name == "gate_up", warps)
                                 for t in self.projection(name)]
        return self._skinny[key]


def position_step(x, pos, k_cache, v_cache, fw_lists, cos, sin, final_norm, cfg_tuple):
    """All layers for one position in plain torch (the CPU loop): x [R, hidden] -> (x,
    final-normed x). Writes K/V at ``pos`` (int64 [1]) into the caches [layers, R, kv_heads,
    16, head_dim]."""
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
        qkv = a @ qkv_w[li].T
        q = qkv[:, : q_heads * head_dim].view(R, q_heads, head_dim)
        k = qkv[:, q_heads * head_dim: (q_heads + kv_heads) * head_dim].view(R, kv_heads, head_dim)
        v = qkv[:, (q_heads + kv_heads) * head_dim:].view(R, kv_heads, head_dim)
        q = rms_norm(q, q_norm[li], eps)
        k = rms_norm(k, k_norm[li], eps)
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        k_cache[li].index_copy_(2, pos, k.view(R, kv_heads, 1, head_dim))
        v_cache[li].index_copy_(2, pos, v.view(R, kv_heads, 1, head_dim))
        # 16 slots x 128 as products and sums; fp32 throughout, as the reference
        K = k_cache[li].to(torch.float32).unsqueeze(2)  # [R, kv, 1, slots, d]
        qg = q.view(R, kv_heads, rep, 1, head_dim).to(torch.float32)
        scores = (qg * K).sum(-1) * head_dim ** -0.5  # [R, kv, rep, slots]
        scores = scores.masked_fill(~valid, float("-inf"))
        p = torch.softmax(scores, dim=-1).to(x.dtype).to(torch.float32)
        V = v_cache[li].to(torch.float32).unsqueeze(2)  # [R, kv, 1, slots, d]
        attn = (p.unsqueeze(-1) * V).sum(3).to(x.dtype).reshape(R, q_heads * head_dim)
        x = x + attn @ wo[li].T
        a = rms_norm(x, post_norm[li], eps)
        gu = a @ gate_up[li].T
        x = x + (torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]) @ down[li].T
    return x, rms_norm(x, final_norm, eps)


def frame_fingerprint(out: LoopOutput) -> str:
    """sha256 of a frame's codes, logits, talker sum and KV bytes (in that order), to compare
    frames across processes."""
    digest = hashlib.sha256()
    for t in (out.codes, out.logits, out.talker_sum, *(c for kv in out.kv for c in kv)):
        digest.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def frame_difference_mask(a: LoopOutput, b: LoopOutput) -> torch.Tensor:
    """Where two frames' bits differ, as one bool vector on their device (no host sync, so a
    stress loop can queue it behind each frame): per group the codes, then the logits; per
    layer the K cache, then the V cache, by position; last the talker sum. Bit patterns are
    compared (a NaN equals its own bits, -0 differs from +0). :func:`frame_difference` reads
    it."""
    def bits(t):
        return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])

    parts = [(a.codes != b.codes).any(0), (bits(a.logits) != bits(b.logits)).any(2).any(0)]
    for kv_a, kv_b in zip(a.kv, b.kv):  # [rows, kv heads, positions, head_dim] each
        parts += [(bits(x) != bits(y)).any(3).any(1).any(0) for x, y in zip(kv_a, kv_b)]
    parts.append((bits(a.talker_sum) != bits(b.talker_sum)).any().view(1))
    return torch.cat(parts)


def describe_difference(mask, groups: int, layers: int, positions: int) -> dict | None:
    """A :func:`frame_difference_mask` (on the host: a list or tensor of bools) as a dict, or
    None when nothing differs: the differing ``codes`` and ``logits`` groups, the ``kv``
    (layer, "k" | "v", position) triples, ``talker_sum``, and ``first``: the earliest point of
    the frame that differs (group s is drawn at position s + 1; within a position the cache
    append comes before the logits, the logits before the code; the talker sum ends the
    frame)."""
    m = [bool(x) for x in (mask.tolist() if hasattr(mask, "tolist") else mask)]
    if not any(m):
        return None
    codes = [s for s in range(groups) if m[s]]
    logits = [s for s in range(groups) if m[groups + s]]
    base = 2 * groups
    kv = [(li, "kv"[c], p) for li in range(layers) for c in range(2) for p in range(positions)
          if m[base + (2 * li + c) * positions + p]]
    events = [((p, 0, li, c), f"kv layer {li} {c} position {p}") for li, c, p in kv]
    events += [((s + 1, 1, 0, ""), f"logits group {s}") for s in logits]
    events += [((s + 1, 2, 0, ""), f"codes group {s}") for s in codes]
    if m[-1]:
        events.append(((positions, 3, 0, ""), "talker sum"))
    first = min(events)
    return {"first": first[1], "first_position": min(first[0][0], positions - 1),
            "codes": codes, "logits": logits, "kv": kv, "talker_sum": m[-1]}


def frame_difference(a: LoopOutput, b: LoopOutput) -> dict | None:
    """Where frame ``b``'s bits first differ from ``a``'s (:func:`describe_difference`), or None
    when they are identical."""
    return describe_difference(frame_difference_mask(a, b).cpu(), a.codes.shape[1], len(a.kv),
                               a.kv[0][0].shape[2])


class ChainBuffers:
    """One position chain's activations on the kernels path: the residual rows ``x``, their
    normalised copy ``xn`` (tensor-core path only), and the QKV, attention and SwiGLU outputs."""

    def __init__(self, cfg, rows: int, device, dtype, tensor_core: bool):
        self.x = torch.zeros(rows, cfg.hidden, device=device, dtype=dtype)
        if tensor_core:  # the tensor-core projections take a normalised copy
            self.xn = torch.zeros_like(self.x)
        self.qkv_out = torch.zeros(rows, (cfg.q_heads + 2 * cfg.kv_heads) * cfg.head_dim,
                                   device=device, dtype=dtype)
        self.attn = torch.zeros(rows, cfg.q_heads * cfg.head_dim, device=device, dtype=dtype)
        self.mlp = torch.zeros(rows, cfg.intermediate, device=device, dtype=dtype)


def _depth_frame_or_reason(fw, rows, sampler, teacher_forced, plan):
    """(the frame kernel for these weights and rows, None) or (None, why it cannot run). A
    sampler's step goes to the frame only where the frame draws it in place
    (kernels.depth.frame.sampler_refusal: fused_draw_args() returns args, no top-p)."""
    if sampler is not None:
        why = sampler_refusal(sampler, rows)
        if why is not None:
            return None, f"a sampler the frame cannot draw in place: {why}"
    if plan is not None and plan != frame_plan(rows):
        return None, "plan: an A/B plan of the fast loop's kernels, not of the frame kernel"
    try:
        return DepthFrame(fw, rows, teacher_forced=teacher_forced, sampler=sampler), None
    except (FrameUnsupported, FrameRefused, WorkbenchError) as e:
        return None, str(e)


class FastLoop:
    """One frame for a fixed row count: call with (h [R, talker_hidden], g0 [R]) and, when built
    with ``teacher_forced=True``, ``codes`` [R, 15].

    ``sampler``: a :class:`Sampler` whose ``fused_draw_args()`` is not None and whose top-p is
    off (a CUDA one), or None for greedy. ``graph``: capture the frame as one CUDA graph (None:
    on a CUDA device). ``plan``: the :class:`schedules.plan.FramePlan` the kernels path runs
    (``self.plan``); None: the bucket's, ``frame_plan(rows)``. Only A/B runs and traces pass
    another (scripts/ab_frame.py, scripts/trace_frame.py: ``schedules.plan_variant``). The
    kernels path's talker sum is an fp32 sum of the first 15 slots plus the last slot, rounded
    once: the reference's contract, with the last slot added last, so an element may differ
    from the reference's ``sum(1)`` in its last bit. NaN logits follow the sampler's rule
    (never drawn); a row left without a candidate draws the code ``vocab`` on the GPU, where a
    captured frame cannot raise (the CPU loop refuses it), so check for it.
    """

    def __init__(self, fw: FastWeights, rows: int, sampler: Sampler | None = None, *,
                 teacher_forced: bool = False, graph: bool | None = None,
                 plan: FramePlan | None = None, depth_kernel: bool | str = False):
        """``depth_kernel``: True runs the frame as one persistent launch (kernels.depth.frame,
        issue #26) where it can run safely; where it cannot (not sm_90, fewer SMs than its
        grid, MPS, co-residency not guaranteed, not the 1.7B bf16 shapes, more than 64 rows,
        a sampler whose steps cannot be drawn in place: ``fused_draw_args()`` None, or top-p),
        the refusal is logged, kept in ``depth_kernel_refused`` and this fast loop runs
        instead (which refuses, as always, a sampler it cannot draw with either). The frame
        draws a sampler's steps in place and advances its offsets by 15 a frame. "auto": the
        plan's dispatch rule (schedules.plan.frame_kernel_dispatch) decides first. A schedule
        the frame's own checks reject (ScheduleError, ValueError) is a bug, raised, not a
        fallback."""
        self.depth_frame, self.depth_kernel_refused = None, None
        if plan is not None and (not isinstance(plan, FramePlan) or plan.rows != rows):
            raise ValueError(f"plan {plan!r}: a schedules.plan.FramePlan for {rows} rows, or None")
        if depth_kernel not in (True, False, "auto"):
            raise ValueError(f"depth_kernel {depth_kernel!r}: True, False or 'auto'")
        if depth_kernel == "auto":
            depth_kernel = frame_kernel_dispatch(rows)
            if not depth_kernel:
                self.depth_kernel_refused = ("the plan's dispatch rule keeps the fast loop at "
                                             f"{rows} rows (schedules.plan.FRAME_KERNEL_FROM_ROWS)")
        if depth_kernel:
            self.depth_frame, self.depth_kernel_refused = _depth_frame_or_reason(
                fw, rows, sampler, teacher_forced, plan)
            if self.depth_frame is not None:
                self._build_depth_frame(fw, rows, teacher_forced, graph, sampler)
                return
            log.warning("depth_kernel refused, running the fast loop: %s",
                        self.depth_kernel_refused)
        cuda = fw.final_norm.device.type == "cuda"
        if not cuda and plan is not None:
            raise ValueError("plan: the kernels path's, which needs a CUDA device")
        if graph and not cuda:
            raise ValueError("graph: CUDA graphs need the weights on a CUDA device")
        if rows < 1:
            raise ValueError(f"rows {rows}: at least 1")
        if cuda and plan is None:
            plan = frame_plan(rows)
        self._build(fw, rows, sampler, teacher_forced, plan)
        self.graph = None
        if cuda if graph is None else graph:
            self._capture()

    def _build_depth_frame(self, fw, rows, teacher_forced, graph, sampler=None):
        """The frame kernel's static inputs and, on request (default), its CUDA graph (the
        sampler's offsets as they were before the warm-up run, as _capture leaves them)."""
        cfg = fw.config
        dev = fw.final_norm.device
        self.fw, self.rows, self.sampler, self.cfg = fw, rows, sampler, cfg
        self.teacher_forced, self.plan, self.run_rows = teacher_forced, None, rows
        self.h = torch.zeros(rows, cfg.talker_hidden, device=dev, dtype=fw.final_norm.dtype)
        self.g0 = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.codes_in = torch.zeros(rows, cfg.heads_drawn, dtype=torch.int64, device=dev)
        self.graph = None
        offset0 = sampler.offset.clone() if sampler is not None else None
        self._frame_out = self._run_depth_frame()
        if graph is None or graph:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._frame_out = self._run_depth_frame()
        if sampler is not None:
            sampler.offset.copy_(offset0)

    def _run_depth_frame(self) -> LoopOutput:
        codes = self.codes_in if self.teacher_forced else None
        return self.depth_frame(self.h, self.g0, codes)

    @classmethod
    def _part(cls, fw, rows, sampler, teacher_forced, plan: FramePlan) -> FastLoop:
        """One part's eager loop (a chain of a loop with ``plan.parts``)."""
        part = cls.__new__(cls)
        part._build(fw, rows, sampler, teacher_forced, plan)
        part.graph = None
        return part

    def _build(self, fw, rows, sampler, teacher_forced, plan: FramePlan | None):
        """Buffers, weights and streams for ``plan`` (None: the CPU loop)."""
        cfg = fw.config
        dev = fw.final_norm.device
        self.fw, self.rows, self.sampler, self.cfg = fw, rows, sampler, cfg
        self.teacher_forced, self.plan = teacher_forced, plan
        if sampler is not None and (sampler.fused_draw_args() is None or sampler.uses["top_p"]):
            raise ValueError("the fast loop draws T / top-k only: this sampler needs the plain "
                             "path (penalty, min-p, top-p, logprobs, eager or CPU)")
        P = self.run_rows = rows if plan is None else plan.run_rows
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
        # the CPU loop's position indices and weight lists (the indices made on every device)
        self.positions = [torch.tensor([p], device=dev) for p in range(cfg.positions)]
        self.lists = (fw.qkv, fw.wo, fw.gate_up, fw.down, fw.in_norm, fw.post_norm, fw.q_norm,
                      fw.k_norm)
        self.cfg_tuple = (cfg.q_heads, cfg.kv_heads, cfg.head_dim, cfg.rms_eps, cfg.intermediate)
        self.part_loops = []
        if plan is not None and plan.parts:  # the parts' loops: eager, on views of our outputs
            start = 0
            for r in plan.parts:
                view = sampler.rows_view(start, start + r) if sampler is not None else None
                part = FastLoop._part(fw, r, view, teacher_forced, plan.part(r))
                part._write_into(self, start)
                self.part_loops.append(part)
                start += part.run_rows
            self.part_streams = [torch.cuda.Stream() for _ in plan.parts]
        elif plan is not None:
            self._build_chain(plan, dev, dt)

    def _build_chain(self, plan: FramePlan, dev, dt):
        """One chain's activations, streams, events, traces and weights."""
        cfg, fw, P, L = self.cfg, self.fw, self.run_rows, self.cfg.layers
        tensor_core = not plan.gemv
        self.buf = ChainBuffers(cfg, P, dev, dt, tensor_core)  # positions 1-15
        self.buf0 = ChainBuffers(cfg, P, dev, dt, tensor_core)  # position 0, on its own stream
        self.prefill_stream = torch.cuda.Stream()
        # recorded after each layer's cache append at position 0; position 1's attention of
        # that layer waits for it
        self.cache_events = [torch.cuda.Event() for _ in range(L)]
        self.first_slots_done = torch.cuda.Event()  # the last draw waits for the partial sum
        # the talker sum's first 15 slots summed in fp32 before the last draw
        self.first_slots_sum = torch.zeros(P, cfg.talker_hidden, device=dev)
        self.draw_traces = None
        if plan.draw_trace:
            self.draw_traces = torch.zeros(cfg.heads_drawn, P, len(DRAW_TRACE_POINTS),
                                           dtype=torch.int64, device=dev)
        self.attn_traces = None
        if plan.attn_trace:
            self.attn_traces = torch.zeros(cfg.positions, L, P, cfg.kv_heads,
                                           len(ATTN_TRACE_POINTS), dtype=torch.int64, device=dev)
        self.kernel_w = self._packed_weights() if tensor_core else {
            name: fw.projection(name) for name in PROJECTIONS}
        # the draw's per-row parameters over the padded rows: the sampler's are copied in at
        # the start of each frame (padding rows draw greedily with seed 0)
        smp = self.sampler
        self.draw_params = None
        # the last draw advances the offsets (not with padded rows: their draws read copies)
        self.draw_advance = smp is not None and not plan.padded
        if smp is not None and plan.padded:
            self.draw_params = {
                "temperature": torch.ones(P, dtype=smp.temperature.dtype, device=dev),
                "top_k": torch.ones(P, dtype=smp.top_k.dtype, device=dev),
                "seed": torch.zeros(P, dtype=smp.seed.dtype, device=dev),
                "offset": torch.zeros(P, dtype=smp.offset.dtype, device=dev)}
        self.layer0_qkv = self._layer0_qkv_table()
        if plan.input_proj == "skinny":  # the bias as the projection's residual rows
            self.proj_bias_rows = fw.proj_b.expand(P, -1).contiguous()

    def _write_into(self, whole: FastLoop, start: int):
        """Take rows [start, start + run_rows) of ``whole``'s inputs and outputs as this loop's
        buffers (a part of a loop built with parts)."""
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
        elif self.plan is not None:
            self._frame_kernels()
        else:
            self._frame()

    def _frame(self):
        """The CPU loop: greedy or teacher-forced (a CPU sampler is refused at build)."""
        fw, cfg = self.fw, self.cfg
        x0 = self.h @ fw.proj_w.T + fw.proj_b
        self.used[:, 0].copy_(fw.talker_embed.index_select(0, self.g0))
        inputs = [x0, fw.talker_embed_proj.index_select(0, self.g0)]
        g = self.g0  # the code drawn at the previous position (set from position 1 on)
        for p in range(cfg.positions):
            x = inputs[p] if p < 2 else fw.embed_proj[p - 2].index_select(0, g)
            _, normed = position_step(x, self.positions[p], self.k_cache, self.v_cache,
                                      self.lists, fw.cos, fw.sin, fw.final_norm, self.cfg_tuple)
            if p == 0:
                continue
            s = p - 1  # this position predicts g_{s+1}
            logits = (normed @ fw.heads[s].T).to(torch.float32)
            self.logits[:, s].copy_(logits)
            if self.teacher_forced:
                g = self.codes_in[:, s]
            else:  # the sampler's NaN rule: NaN never wins; a row without a candidate refused
                refuse_undrawable(logits, f"group {s + 1} logits")
                g = argmax_candidates(logits)
            self.codes[:, s].copy_(g)
            self.used[:, s + 1].copy_(fw.embeds[s].index_select(0, g))
        torch.sum(self.used, 1, out=self.talker_sum)

    def _project(self, name, a, w, out, buf: ChainBuffers, *, gamma=None, resid=None,
                 swiglu: bool = False):
        """out = [resid +] [norm](a) · w^T [SwiGLU]: the fused GEMV on the GEMV plan, else the
        row norm (when gamma is given, into ``buf.xn``) and the split-K tensor-core projection
        on the plan's mainloop and tile (``w`` packed for it: _packed_weights)."""
        plan, eps = self.plan, self.cfg.rms_eps
        if plan.gemv:
            gemv_small_m(a, w, out, gamma=gamma, resid=resid, swiglu=swiglu, pdl=plan.pdl,
                         eps=eps)
            return
        chunk_in = plan.chunk_major_inputs
        if gamma is not None:
            a = rows_rmsnorm(a, gamma, buf.xn, eps=eps, pdl=plan.pdl,
                             chunk_major=name in chunk_in)
        # gate/up's output is down's input: chunk-major when down bulk-copies it
        cm_out = dict(chunk_major_out=True) if name == "gate_up" and "down" in chunk_in else {}
        proj = plan.projection(name)
        tile = proj.tile_kwargs()
        if proj.mainloop.startswith("rwgmma"):  # a chunk-major unless brought by TMA
            gemm_skinny_rwgmma(a, w, out, resid=resid, swiglu=swiglu, pdl=plan.pdl, **cm_out,
                               a_copy="tma" if proj.mainloop == "rwgmma_tma" else "bulk",
                               **tile)
        elif proj.mainloop == "wgmma":  # a chunk-major
            gemm_skinny_wgmma(a, w, out, resid=resid, swiglu=swiglu, pdl=plan.pdl, **cm_out,
                              **{"warps": WGMMA_WARPS, **tile})
        else:
            gemm_skinny(a, w, out, resid=resid, swiglu=swiglu, pdl=plan.pdl, **tile, **cm_out)

    def _packed_weights(self) -> dict:
        """The tensor-core projections' weights as their mainloops take them: the mma.sync
        set (all projections, when any runs on it), the register-A and shared-memory wgmma
        packings (the latter for the tile's warps, else WGMMA_WARPS)."""
        fw, plan = self.fw, self.plan
        loops = {name: plan.projection(name).mainloop for name in PROJECTIONS}
        packed = dict(fw.skinny_weights()) if "sync" in loops.values() else {}
        packed.update({name: fw.rwgmma_weights(name) for name, loop in loops.items()
                       if loop.startswith("rwgmma")})
        wgmma = [name for name, loop in loops.items() if loop == "wgmma"]
        if wgmma:
            packed.update({name: fw.wgmma_weights(name, plan.projection(name).tile_kwargs().get(
                "warps", WGMMA_WARPS)) for name in wgmma})
        return packed

    def _layer0_qkv_table(self) -> torch.Tensor:
        """[positions - 2, vocab, QKV width] bf16: for each draw that feeds a next position
        (0-13) and each code, layer 0's QKV output on that code's input row (``embed_proj``),
        computed as the frame computes it (this loop's ``_project`` on its row count: a row's
        outputs do not depend on the other rows), so gathering it gives the same bits. Built
        once per (run rows, qkv plan) and kept on the FastWeights."""
        fw, cfg, P, plan = self.fw, self.cfg, self.run_rows, self.plan
        key = (P, None if plan.gemv else plan.projection("qkv"))
        if key not in fw.layer0_tables:
            tmp = ChainBuffers(cfg, P, fw.final_norm.device, fw.final_norm.dtype, not plan.gemv)
            V, width = cfg.vocab, tmp.qkv_out.shape[1]
            table = torch.empty(cfg.positions - 2, V, width, device=tmp.x.device,
                                dtype=tmp.x.dtype)
            for s in range(cfg.positions - 2):
                for c0 in range(0, V, P):
                    n = min(P, V - c0)
                    tmp.x.zero_()
                    tmp.x[:n].copy_(fw.embed_proj[s, c0:c0 + n])
                    self._project("qkv", tmp.x, self.kernel_w["qkv"][0], tmp.qkv_out, tmp,
                                  gamma=fw.in_norm[0])
                    table[s, c0:c0 + n].copy_(tmp.qkv_out[:n])
            fw.layer0_tables[key] = table
        return fw.layer0_tables[key]

    def _layer(self, p: int, li: int, buf: ChainBuffers, *, cache_wait=None, cache_done=None):
        """Layer ``li`` of position ``p`` on the chain's activations ``buf`` (x in place); from
        position 2 on layer 0 starts at the attention (the draw wrote its QKV rows).
        ``cache_wait``: an event the attention waits for (position 0's cache append of this
        layer); ``cache_done``: recorded after it."""
        fw, cfg, W, proj = self.fw, self.cfg, self.kernel_w, self._project
        if not (li == 0 and p >= 2):
            proj("qkv", buf.x, W["qkv"][li], buf.qkv_out, buf, gamma=fw.in_norm[li])
        if cache_wait is not None:
            torch.cuda.current_stream().wait_event(cache_wait)
        depth_attention(buf.qkv_out, fw.q_norm[li], fw.k_norm[li], fw.cos, fw.sin,
                        self.k_cache[li], self.v_cache[li], p, buf.attn,
                        q_heads=cfg.q_heads, kv_heads=cfg.kv_heads, eps=cfg.rms_eps,
                        pdl=self.plan.pdl, chunk_major="wo" in self.plan.chunk_major_inputs,
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
        fw, cfg, buf, plan = self.fw, self.cfg, self.buf, self.plan
        if plan.input_proj == "skinny":  # bf16(b + bf16(h · W^T)), as torch rounds it
            gemm_skinny(self.h, fw.input_proj_weights(), self.buf0.x, resid=self.proj_bias_rows,
                        pdl=plan.pdl)
        else:
            torch.add(self.h @ fw.proj_w.T, fw.proj_b, out=self.buf0.x)
        here = torch.cuda.current_stream()
        side = self.prefill_stream  # position 0, a cache append ahead of position 1
        side.wait_stream(here)
        with torch.cuda.stream(side):
            for li in range(cfg.layers):
                self._layer(0, li, self.buf0, cache_done=self.cache_events[li])
            # nothing but the talker sum reads slot 0
            self.used[:, 0].copy_(fw.talker_embed.index_select(0, self.g0))
        # the last layer's event (or slot 0's) follows that stream's last kernel, so a wait for
        # it also rejoins the stream (as a capture requires)
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
        for p in range(1, cfg.positions):
            if p == 1:
                torch.index_select(fw.talker_embed_proj, 0, self.g0, out=buf.x)
            for li in range(cfg.layers):
                self._layer(p, li, buf, cache_wait=self.cache_events[li] if p == 1 else None)
            s = p - 1  # this position predicts g_{s+1}
            self._project("heads", buf.x, self.kernel_w["heads"][s], self.logits[:, s], buf,
                          gamma=fw.final_norm)
            # the next position's first QKV rows by the draw (none after the last)
            nxt = {}
            if p + 1 < cfg.positions:
                nxt = dict(qkv_table=self.layer0_qkv[s], qkv_next=buf.qkv_out)
            if s == cfg.heads_drawn - 1:  # the last draw ends the talker sum (no kernel after)
                here.wait_event(self.first_slots_done)
                nxt = dict(sum_in=self.first_slots_sum, sum_out=self.talker_sum)
                if self.draw_advance:  # and the sampler's offsets
                    nxt["advance"] = cfg.heads_drawn
            depth_draw(self.logits[:, s], self.codes[:, s], fw.embed_proj[s], fw.embeds[s],
                       buf.x, self.used[:, s + 1], s, mode=mode, codes_in=self.codes_in[:, s],
                       pdl=plan.pdl, noise=plan.draw_noise,
                       trace=None if self.draw_traces is None else self.draw_traces[s],
                       **nxt, **draw_args)
            if s == cfg.heads_drawn - 2:  # every slot but the last is written
                self._sum_first_slots()
        if smp is not None and not self.draw_advance:  # off the tail, after the last draw
            side.wait_stream(here)
            with torch.cuda.stream(side):
                smp.advance_offsets(cfg.heads_drawn)
            here.wait_stream(side)

    def _sum_first_slots(self):
        """The fp32 sum of the talker sum's slots but the last (``first_slots_sum``), to which
        the last draw adds its row: on position 0's stream, after the draw that wrote the
        second-to-last slot (the last draw waits for ``first_slots_done``)."""
        here, stream = torch.cuda.current_stream(), self.prefill_stream
        stream.wait_stream(here)
        with torch.cuda.stream(stream):
            torch.sum(self.used[:, :-1], 1, dtype=torch.float32, out=self.first_slots_sum)
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
        if self.depth_frame is not None:
            if self.graph is not None:
                self.graph.replay()
                return self._frame_out
            return self._run_depth_frame()
        if self.graph is not None:
            self.graph.replay()
        else:
            self._run_frame()
        kv = [(self.k_cache[i, :R], self.v_cache[i, :R]) for i in range(self.cfg.layers)]
        return LoopOutput(self.codes[:R], self.talker_sum[:R], kv, self.logits[:R])
