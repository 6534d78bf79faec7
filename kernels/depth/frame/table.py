"""The depth frame's phase table: one row of PHASE_FIELDS a phase (what each field means is
below), the arena offsets the frame kernel reads its inputs and outputs from."""
from __future__ import annotations

from schedules import depth_frame as F

# a phase's arena offsets (32-bit words; -1 none) and its fused steps (``fused`` builds only):
# a_word, y_word: input and output; gamma_word: RMSNorm the input with these weights, its row
# factors from the ssq partials at ssq_in_word; resid_word, resid_kind: add a residual (1:
# chunk-major like y, 2: a bias a feature) after the projection's rounding; ssq_out_word: write
# the output's per-tile row sums of squares (64 tiles of 16 features). Attention
# (attention.py): a_word its qkv, y_word its output, gamma_word q_norm then
# k_norm, kv_word the layer's K cache (V after it), rope_word the position's cos then sin,
# slot the position. Embedding (embedding.py): a_word the logits drawn from
# (-1: position 1, code g0), y_word / ssq_out_word the position's h and partials, code_word
# the codes [R8][16] int32, group the code column it takes or draws, table_word the
# pre-projected rows it gathers (-1: none, the last draw), talker_word the Talker-space rows,
# sum_word the Talker sum, bf16 [R8][talker_hidden] (the last step only)
PHASE_FIELDS = ("a_word", "y_word", "gamma_word", "ssq_in_word", "resid_word", "resid_kind",
                "ssq_out_word", "kv_word", "rope_word", "slot", "code_word", "group",
                "table_word", "talker_word", "sum_word")
RESID_NONE, RESID_ROWS, RESID_BIAS = 0, 1, 2


def unfused_row(a_word: int, y_word: int) -> list:
    """A phase-table row with only an input and an output (no norm, residual or ssq)."""
    return table_row(a_word, y_word)


def table_row(a_word, y_word, gamma_word=-1, ssq_in_word=-1, resid_word=-1,
              resid_kind=RESID_NONE, ssq_out_word=-1, **more) -> list:
    """One phase's PHASE_FIELDS (above); ``more``
    sets the attention and embedding fields by name (the rest are -1)."""
    row = dict(a_word=a_word, y_word=y_word, gamma_word=gamma_word, ssq_in_word=ssq_in_word,
               resid_word=resid_word, resid_kind=resid_kind, ssq_out_word=ssq_out_word)
    unknown = set(more) - set(PHASE_FIELDS)
    if unknown:
        raise ValueError(f"unknown phase fields {sorted(unknown)}")
    row.update(more)
    return [row.get(k, -1) for k in PHASE_FIELDS]


def phase_row(ph, o: dict, cfg, norm_once: bool = False) -> list:
    """Phase ``ph``'s PHASE_FIELDS over the regions ``o``.
    ``norm_once`` (schedules.depth_frame.FrameOptions): a norm phase normalises h into
    ("xn", type, layer, pos) with the gamma and ssq its projection would have used, and the
    projection reads that, with no norm of its own (gamma_word -1)."""
    p, l = ph.pos, ph.layer
    gamma = {F.QKV: ("in", l), F.GATEUP: ("post", l), F.HEAD: "final"}
    if ph.type == F.NORM:
        return table_row(o[("h", p)], o[("xn", ph.feeds, l, p)], gamma_word=o[gamma[ph.feeds]],
                         ssq_in_word=o[("ssq", p)])
    if norm_once and ph.type in F.NORMALISED:
        y = o[("qkv", l, p)] if ph.type == F.QKV else o[("act", l, p)] \
            if ph.type == F.GATEUP else o[("logits", p)]
        return table_row(o[("xn", ph.type, l, p)], y)
    if ph.type == F.PROJ:
        return table_row(o["x_t"], o[("h", 0)], resid_word=o["bias"], resid_kind=RESID_BIAS,
                         ssq_out_word=o[("ssq", 0)])
    if ph.type == F.QKV:
        return table_row(o[("h", p)], o[("qkv", l, p)], gamma_word=o[("in", l)],
                         ssq_in_word=o[("ssq", p)])
    if ph.type == F.ATTN:
        return table_row(o[("qkv", l, p)], o[("attn", l, p)], gamma_word=o[("qk_norm", l)],
                         kv_word=o[("kv", l)], rope_word=o[("rope", p)], slot=p)
    if ph.type == F.O:
        return table_row(o[("attn", l, p)], o[("h", p)], resid_word=o[("h", p)],
                         resid_kind=RESID_ROWS, ssq_out_word=o[("ssq", p)])
    if ph.type == F.GATEUP:
        return table_row(o[("h", p)], o[("act", l, p)], gamma_word=o[("post", l)],
                         ssq_in_word=o[("ssq", p)])
    if ph.type == F.DOWN:
        return table_row(o[("act", l, p)], o[("h", p)], resid_word=o[("h", p)],
                         resid_kind=RESID_ROWS, ssq_out_word=o[("ssq", p)])
    if ph.type == F.HEAD:
        return table_row(o[("h", p)], o[("logits", p)], gamma_word=o["final"],
                         ssq_in_word=o[("ssq", p)])
    # EMBED at position p: its code is column p - 1 (g0 at p = 1); p <= 15 gathers table
    # p - 1 (talker_embed_proj, then embed_proj[p - 2]); p = 16 makes the Talker sum
    last = p == cfg.positions
    before = 0 if p == 1 else cfg.talker_vocab + (p - 2) * cfg.vocab  # the table's first row
    table = -1 if last else o["embed_proj"] + before * cfg.hidden // 2
    return table_row(o[("logits", p - 1)] if p >= 2 else -1, -1 if last else o[("h", p)],
                     ssq_out_word=-1 if last else o[("ssq", p)], code_word=o["codes"],
                     group=p - 1, table_word=table, talker_word=o["talker"],
                     sum_word=o["sum"] if last else -1)
