"""The whole CodePredictor frame as one persistent launch (issue #26): host side.

:class:`DepthFrame` lays one frame's data out in the frame kernel's arena
(kernel.py walks the schedule; the bodies are in projection.py, attention.py and
embedding.py), packs the weights for the page ring, and turns the
arena back into the loop's :class:`models.codepredictor.LoopOutput`. Every launch rewrites
every output, so a replay needs only the inputs copied in (:meth:`DepthFrame.__call__`, CUDA-
graph capturable).

The arena (32-bit words; every region 16-byte aligned; chunk-major is [N / 8][R8][8] bf16):

| region | layout |
|---|---|
| x_t | the Talker state h, chunk-major [2048] |
| codes | [R8][16] int32: g0 (given), g1..g15 (given or drawn) |
| draw (sampled builds) | [R8][8] words, each row's T, k, seed, offset (embedding.DRAW_WORDS) |
| h_p, ssq_p (p = 0..15) | the residual stream, chunk-major [1024]; its [64][R8] fp32 tile partials |
| qkv_{l,p}, attn_{l,p}, act_{l,p} | chunk-major [4096] (by kv head), [2048], [3072] |
| kv_l | K [8][16][R8][128] bf16, then V |
| logits_p (p = 1..15) | chunk-major [2048] |
| sum | the Talker sum [R8][2048] bf16, row-major |
| constants | norms (in / post per layer, q_norm then k_norm per layer, final), proj bias, cos then sin per position |
| tables | talker_embed_proj [3072][1024], embed_proj[0..14] ([2048][1024] bf16 each); talker_embed [3072][2048], embeds[0..14] ([2048][2048] bf16 each) |

Every (layer, position) has its own qkv / attn / act: positions 0 and 1 run side by side, so
those are never reused. h_p and ssq_p are updated in place by o and down, after every reader of
the old values (qkv, gate/up) has signalled: the counters order it.
"""
from __future__ import annotations

import torch

from configs.codepredictor import QWEN3_TTS_1P7B, LoopOutput
from kernels.depth.frame.attention import kv_cache_words, qkv_rows_by_kv_head
from kernels.depth.frame.embedding import DRAW_WORDS
from kernels.depth.frame.launch import ProtocolRun
from kernels.depth.frame.projection import MAX_ROWS, SSQ_TILES, rows8
from kernels.depth.frame.table import phase_row
from kernels.depth.frame.weights import from_chunk_major, pack_frame_weights
from schedules import depth_frame as F
from schedules.plan import FRAME_RING, frame_chunk_waits, frame_norm_once

POISON = 0x7FC07FC0  # a bf16 NaN pair (and an fp32 NaN)


class FrameUnsupported(ValueError):
    """The frame kernel does not take these weights or this step (the message says why)."""


def check_frame_inputs(fw, rows: int) -> None:
    """What the frame kernel is built for: the 1.7B CodePredictor's shapes (the Talker's codec
    embedding of the config's ``talker_vocab`` rows too) in bf16 on a CUDA device, 1..64 rows.
    Raises FrameUnsupported."""
    if fw.config != QWEN3_TTS_1P7B:
        raise FrameUnsupported("the frame kernel takes the 1.7B CodePredictor's shapes only")
    if fw.talker_embed.shape[0] != fw.config.talker_vocab:
        raise FrameUnsupported(f"the Talker's codec embedding has {fw.talker_embed.shape[0]} "
                               f"rows; the frame kernel takes {fw.config.talker_vocab}")
    if fw.final_norm.dtype != torch.bfloat16:
        raise FrameUnsupported(f"the frame kernel takes bf16 weights, not {fw.final_norm.dtype}")
    if fw.final_norm.device.type != "cuda":
        raise FrameUnsupported("the frame kernel needs the weights on a CUDA device")
    if not 1 <= rows <= MAX_ROWS:
        raise FrameUnsupported(f"rows {rows}: the frame kernel takes 1..{MAX_ROWS} rows a step")
    dev = fw.final_norm.device
    if dev.index is not None and dev.index != torch.cuda.current_device():
        raise FrameUnsupported(f"the weights are on {dev} but the current device is "
                               f"cuda:{torch.cuda.current_device()}: the frame's buffers and "
                               "its occupancy check must be on the weights' GPU")


def sampler_refusal(sampler, rows: int) -> str | None:
    """Why the frame cannot draw a step of ``sampler`` in place (None: it can): the sampler's
    own contract first (``fused_draw_args()`` is None for an eager step, a repetition penalty,
    min-p, logprobs, a kept last token or a CPU sampler), then what the fused draw lacks
    (top-p: kernels/depth/draw.py has none, as the fast loop's), then its row count."""
    if sampler.fused_draw_args() is None:
        return ("the sampler's step needs the plain path: fused_draw_args() is None (an eager "
                "step, a repetition penalty, min-p, logprobs, a kept last token or a CPU "
                "sampler)")
    if sampler.uses["top_p"]:
        return "top-p: the fused draw (kernels/depth/draw.py) has none"
    if sampler.offset.shape[0] != rows:
        return f"the sampler has {sampler.offset.shape[0]} rows, the frame {rows}"
    return None


class Regions:
    """Word offsets (``at``) and sizes of named arena regions, allocated in order, each
    16-byte aligned; the outputs come first (``outputs_end``: the first constant's word)."""

    def __init__(self):
        self.at, self.size, self.words, self.outputs_end = {}, {}, 0, 0

    def add(self, key, words: int) -> int:
        self.at[key], self.size[key] = self.words, words
        self.words += -(-words // 4) * 4
        return self.at[key]


def frame_layout(cfg, rows: int, norm_once: bool = False, sample: bool = False) -> Regions:
    """The arena's regions for a step of ``rows`` rows (the module docstring's table);
    ``norm_once`` (schedules.depth_frame.FrameOptions) adds ("xn", type, layer, pos), the
    normalised input of every qkv, gate/up (layer, pos) and head (-1, pos) phase, chunk-major
    [1024], written once by its norm phase; ``sample`` adds the sampled draw's parameters
    ("draw", right after the codes: the kernel finds them at code_word + 16 R8)."""
    r8 = rows8(rows)
    a = Regions()
    a.add("x_t", cfg.talker_hidden * r8 // 2)
    a.add("codes", r8 * cfg.groups)
    if sample:
        a.add("draw", r8 * DRAW_WORDS)
        assert a.at["draw"] == a.at["codes"] + 16 * r8, "the kernel's parameter offset"
    for p in range(cfg.positions):
        a.add(("h", p), cfg.hidden * r8 // 2)
        a.add(("ssq", p), SSQ_TILES * r8)
    for l in range(cfg.layers):
        for p in range(cfg.positions):
            a.add(("qkv", l, p), cfg.qkv_dim * r8 // 2)
            a.add(("attn", l, p), cfg.q_dim * r8 // 2)
            a.add(("act", l, p), cfg.intermediate * r8 // 2)
        a.add(("kv", l), 2 * kv_cache_words(r8))
    for p in range(1, cfg.positions):
        a.add(("logits", p), cfg.vocab * r8 // 2)
    a.add("sum", r8 * cfg.talker_hidden // 2)
    if norm_once:
        for p in range(cfg.positions):
            for l in range(cfg.layers):
                a.add(("xn", F.QKV, l, p), cfg.hidden * r8 // 2)
                a.add(("xn", F.GATEUP, l, p), cfg.hidden * r8 // 2)
            if p >= 1:
                a.add(("xn", F.HEAD, -1, p), cfg.hidden * r8 // 2)
    a.outputs_end = a.words
    for l in range(cfg.layers):
        a.add(("in", l), cfg.hidden // 2)
        a.add(("post", l), cfg.hidden // 2)
        a.add(("qk_norm", l), cfg.head_dim)
    a.add("final", cfg.hidden // 2)
    a.add("bias", cfg.hidden // 2)
    for p in range(cfg.positions):
        a.add(("rope", p), cfg.head_dim)
    table_rows = cfg.talker_vocab + cfg.heads_drawn * cfg.vocab  # g0's codebook, then the groups'
    a.add("embed_proj", table_rows * cfg.hidden // 2)
    a.add("talker", table_rows * cfg.talker_hidden // 2)
    return a


class DepthFrame:
    """One frame for ``rows`` rows (1..64) as one persistent launch: call with (h [R, 2048],
    g0 [R]) and, when built with ``teacher_forced=True``, ``codes`` [R, 15]; returns the
    loop's LoopOutput (partly views of the arena: copy them before the next call). Greedy draws
    otherwise (models.sampler.argmax_candidates; a row without a candidate gets the code
    ``vocab``, which the caller must check, as in the fast loop), or with ``sampler`` the
    loop's sampled draws (kernels/depth/draw.py RowDraw: each code the one Sampler.sample()
    draws from the frame's own logits at the row's T, top-k, seed and offset + group - 1;
    the sampler's offsets advance by 15 after each call, as fifteen sample() calls; a
    teacher-forced frame advances them too, as the loop). ``trace``: six %globaltimer stamps
    a task (``self.run.task_stamps()``).

    Refuses (before anything launches) with FrameUnsupported for other shapes, dtypes or row
    counts, and with kernels.depth.frame.FrameRefused where the grid cannot be
    resident (not sm_90, too few SMs, MPS, the occupancy API)."""

    def __init__(self, fw, rows: int, *, teacher_forced: bool = False, trace: bool = False,
                 norm_once: bool | None = None, sampler=None, chunk_waits: bool | None = None):
        """``norm_once``: normalise each qkv / gate-up / head input once in a norm phase
        (schedules.depth_frame.FrameOptions; None: the plan's rule by rows). The same bits
        either way. ``chunk_waits``: o and down wait per K stage for their chunk's producers
        (schedules.depth_frame.FrameOptions; None: the plan's rule, frame_chunk_waits); the
        same bits either way. ``sampler``: a models.sampler.Sampler on the weights' device whose steps
        the frame can draw (:func:`sampler_refusal`, else FrameUnsupported)."""
        check_frame_inputs(fw, rows)
        if sampler is not None:
            why = sampler_refusal(sampler, rows)
            if why is None and sampler.offset.device != fw.final_norm.device:
                why = f"the sampler is on {sampler.offset.device}, the weights elsewhere"
            if why is not None:
                raise FrameUnsupported(why)
        norm_once = frame_norm_once(rows) if norm_once is None else norm_once
        chunk_waits = frame_chunk_waits(rows) if chunk_waits is None else chunk_waits
        cfg = fw.config
        self.fw, self.cfg, self.rows, self.r8 = fw, cfg, rows, rows8(rows)
        self.teacher_forced, self.sampler = teacher_forced, sampler
        self.draw = "given" if teacher_forced else ("greedy" if sampler is None else "sample")
        sample = self.draw == "sample"
        self.schedule = F.build(cfg, F.FrameOptions(rows=rows, norm_once=norm_once,
                                                    embed_rows=1 if sample else 8,
                                                    chunk_waits=chunk_waits, **FRAME_RING))
        self.regions = frame_layout(cfg, rows, norm_once, sample)
        dev = fw.final_norm.device
        self.arena = torch.full((self.regions.words,), POISON, dtype=torch.int32, device=dev)
        self._put_constants()
        self.phases = torch.tensor([phase_row(ph, self.regions.at, cfg, norm_once)
                                    for ph in self.schedule.phases],
                                   dtype=torch.int32, device=dev)
        order = torch.tensor(qkv_rows_by_kv_head(cfg), device=dev)
        packed = pack_frame_weights(self.schedule, {
            "qkv": [w.index_select(0, order) for w in fw.qkv], "wo": fw.wo,
            "gate_up": fw.gate_up, "down": fw.down, "heads": fw.heads, "proj": fw.proj_w})
        self.run = ProtocolRun(self.schedule, trace=trace, weights=packed,
                               io=(self.phases, self.arena), fused=True, draw=self.draw)

    def _put(self, key, t, offset: int = 0):
        flat = t.contiguous().view(torch.int32).reshape(-1)
        w0 = self.regions.at[key] + offset
        self.arena[w0: w0 + flat.numel()] = flat

    def _put_constants(self):
        fw, c = self.fw, self.cfg
        for l in range(c.layers):
            self._put(("in", l), fw.in_norm[l])
            self._put(("post", l), fw.post_norm[l])
            self._put(("qk_norm", l), torch.cat([fw.q_norm[l], fw.k_norm[l]]))
        self._put("final", fw.final_norm)
        self._put("bias", fw.proj_b)
        for p in range(c.positions):
            self._put(("rope", p), torch.cat([fw.cos[p], fw.sin[p]]))
        self._put("embed_proj", torch.cat([fw.talker_embed_proj, *fw.embed_proj]))
        self._put("talker", torch.cat([fw.talker_embed, *fw.embeds]))

    # ---- views ----------------------------------------------------------------------------
    def _bf16(self, key, n: int):
        w0 = self.regions.at[key]
        return self.arena[w0: w0 + n * self.r8 // 2].view(torch.bfloat16)

    def codes_view(self):
        """[R8][16] int32: g0, then g1..g15."""
        w0 = self.regions.at["codes"]
        return self.arena[w0: w0 + self.r8 * self.cfg.groups].view(self.r8, self.cfg.groups)

    def draw_params_view(self):
        """[R8][DRAW_WORDS] int32 (sampled builds): T bits, k, seed lo / hi, offset lo / hi."""
        w0 = self.regions.at["draw"]
        return self.arena[w0: w0 + self.r8 * DRAW_WORDS].view(self.r8, DRAW_WORDS)

    def _put_draw_params(self):
        """The sampler's per-row T, top-k (clamped to 0..vocab, as models.sampler reads it),
        seed and offset into the arena: torch copies, so a captured frame reads the values
        of its replay."""
        s, R = self.sampler, self.rows
        p = self.draw_params_view()
        p[:R, 0].copy_(s.temperature.contiguous().view(torch.int32))
        p[:R, 1].copy_(s.top_k.clamp(0, self.cfg.vocab))
        p[:R, 2:4].copy_(s.seed.contiguous().view(torch.int32).view(R, 2))
        p[:R, 4:6].copy_(s.offset.contiguous().view(torch.int32).view(R, 2))

    def poison(self):
        """Every output region NaN and the codes but g0 -1: a run must rewrite them all."""
        self.arena[:self.regions.outputs_end].fill_(POISON)
        self.codes_view()[:, 1:].fill_(-1)

    # ---- a frame --------------------------------------------------------------------------
    def __call__(self, h, g0, codes=None):
        """One frame: a LoopOutput whose talker_sum and kv are views of the arena, codes and
        logits copies made from it. Raises ValueError for inputs of the wrong shape, dtype or
        device, codes outside their codebooks (g0: 3072 entries, g1..g15: 2048; checked
        outside CUDA-graph capture only: a captured replay clamps them on the device), or
        codes given to a greedy frame (or missing)."""
        R, c = self.rows, self.cfg
        dev = self.arena.device
        if tuple(h.shape) != (R, c.talker_hidden) or h.device != dev or not h.is_floating_point():
            raise ValueError(f"h must be a floating [{R}, {c.talker_hidden}] tensor on {dev}, "
                             f"got {tuple(h.shape)} {h.dtype} on {h.device}")
        if tuple(g0.shape) != (R,) or g0.device != dev or g0.is_floating_point():
            raise ValueError(f"g0 must be an integer [{R}] tensor on {dev}")
        if (codes is not None) != self.teacher_forced:
            raise ValueError("pass codes exactly when the frame was built with "
                             "teacher_forced=True")
        if codes is not None and (tuple(codes.shape) != (R, c.heads_drawn) or
                                  codes.device != dev or codes.is_floating_point()):
            raise ValueError(f"codes must be an integer [{R}, {c.heads_drawn}] tensor on {dev}")
        if not torch.cuda.is_current_stream_capturing():  # (a host sync; not while capturing)
            for name, t, n in (("g0", g0, c.talker_vocab), ("codes", codes, c.vocab)):
                if t is not None and t.numel() and not bool(((t >= 0) & (t < n)).all()):
                    raise ValueError(f"{name} holds codes outside [0, {n}) (got "
                                     f"{int(t.min())}..{int(t.max())})")
        x = self._bf16("x_t", c.talker_hidden).view(c.talker_hidden // 8, self.r8, 8)
        x[:, :R].copy_(h.to(torch.bfloat16).reshape(R, c.talker_hidden // 8, 8).transpose(0, 1))
        cv = self.codes_view()
        cv[:R, 0].copy_(g0)
        if codes is not None:
            cv[:R, 1:].copy_(codes)
        if self.draw == "sample":
            self._put_draw_params()
        self.run.launch()
        if self.sampler is not None:  # fifteen draws a row, as fifteen sample() calls
            self.sampler.advance_offsets(c.heads_drawn)
        return LoopOutput(self.codes_out(), self.talker_sum(), self.kv(), self.logits())

    def launch(self):
        """The kernel alone, on the arena's inputs as they are (a sampled build: the draw
        parameters of the last call; no offset advance)."""
        self.run.launch()

    def codes_out(self):
        return self.codes_view()[:self.rows, 1:].long()

    def talker_sum(self):
        c = self.cfg
        return self._bf16("sum", c.talker_hidden).view(self.r8, c.talker_hidden)[:self.rows]

    def kv(self) -> list:
        """Per layer (K, V) [R, kv_heads, 16, head_dim], as the loop returns them."""
        c, r8 = self.cfg, self.r8
        out = []
        for l in range(c.layers):
            w0 = self.regions.at[("kv", l)]
            both = self.arena[w0: w0 + 2 * kv_cache_words(r8)].view(torch.bfloat16)
            both = both.view(2, c.kv_heads, c.positions, r8, c.head_dim)[:, :, :, :self.rows]
            out.append((both[0].permute(2, 0, 1, 3), both[1].permute(2, 0, 1, 3)))
        return out

    def logits(self):
        """[R, 15, vocab] fp32 (the head's bf16 values)."""
        c = self.cfg
        return torch.stack([from_chunk_major(self._bf16(("logits", p), c.vocab), self.rows,
                                             c.vocab).float() for p in range(1, c.positions)],
                           dim=1)

    def output(self, key, n: int):
        """[R, n] bf16 of a chunk-major region (e.g. ("qkv", l, p), 4096), for diagnosis."""
        return from_chunk_major(self._bf16(key, n), self.rows, n)
