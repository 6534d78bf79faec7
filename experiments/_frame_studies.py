"""Studies of the depth frame's tiles (kernels/depth/frame/projection.py), apart from the
production kernel: harnesses that check the tiles on random data (the phase tables and arenas
they run on, and their references) and the tile knobs still under A/B. A helper module, not an
experiment (hence the underscore): only tests, experiments and scripts/ build them.

* :class:`ProjectionStudy`: every projection tile in isolation (fixed inputs), against float64
  within a derived bound.
* :class:`ResidualStudy`: the residual stream with its fused steps (``fused`` builds): RMSNorm
  on the qkv / gate-up / head inputs from the ssq partials, the residual adds of o and down,
  the bias of proj, position by position, against an fp32 emulation of the same roundings.
  The fused build compiles the attention and embedding bodies too, but the study's phase
  table gives those tasks no inputs, so they wait and signal only: o reads a fixed input and
  each position's stream starts from a given state.
* :class:`TileStudy`: the projection tiles' A/B knobs (scripts/frame_tiles_ab.py), which reach
  a kernel only through :class:`TileStudyKernel` and :class:`TileStudyRun`, never through the
  production FrameKernel or ProtocolRun.
* :class:`FrameStudyKernel` / :class:`FrameStudyRun`: the code-size study and the whole
  frame's ablations (scripts/frame_code_size.py): only the named task types' bodies compiled
  (FrameKernel's ``bodies``), or one step of the projection tiles left out (``ablate``).
* :func:`snapshot_outputs` / :func:`same_bits`: a frame's outputs kept past the next launch,
  and compared bit for bit (the A/B scripts' check that two builds did the same arithmetic).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.depth.frame import FrameBuild, FrameKernel, ProtocolRun
from kernels.depth.frame.projection import SSQ_TILES, TILE_FEATURES, check_rows, rows8
from kernels.depth.frame.table import RESID_ROWS, phase_row, table_row, unfused_row
from kernels.depth.frame.weights import chunk_major_rows, from_chunk_major, pack_frame_weights
from numerics.rmsnorm import rms_apply
from schedules import depth_frame as F


class ProjectionStudy:
    """The frame's projection tiles checked in isolation (tests, experiments/frame_protocol.py):
    random weights and inputs, one fixed input per projection kind and one output per (kind,
    layer or position), so every position recomputes, and rewrites with the same bits, what the
    first one wrote. Attention and embedding tasks keep their waits and signals only. The
    arena holds the inputs and outputs chunk-major ([K / 8][R8][8] bf16)."""

    INPUTS = {F.QKV: "x_h", F.GATEUP: "x_h", F.HEAD: "x_h", F.O: "x_q", F.DOWN: "x_i",
              F.PROJ: "x_t"}

    def __init__(self, schedule, seed: int = 0, device: str = "cuda"):
        cfg, rows = schedule.config, schedule.options.rows
        check_rows(rows)
        self.schedule, self.rows, self.r8 = schedule, rows, rows8(rows)
        g = torch.Generator(device=device).manual_seed(seed)

        def rand(*shape, scale):
            return (torch.randn(*shape, generator=g, device=device) * scale).to(torch.bfloat16)

        h, q, i, t = cfg.hidden, cfg.q_dim, cfg.intermediate, cfg.talker_hidden
        self.weights = {
            "qkv": [rand(cfg.qkv_dim, h, scale=h ** -0.5) for _ in range(cfg.layers)],
            "wo": [rand(h, q, scale=q ** -0.5) for _ in range(cfg.layers)],
            "gate_up": [rand(2 * i, h, scale=h ** -0.5) for _ in range(cfg.layers)],
            "down": [rand(h, i, scale=i ** -0.5) for _ in range(cfg.layers)],
            "heads": [rand(cfg.vocab, h, scale=h ** -0.5) for _ in range(cfg.heads_drawn)],
            "proj": rand(h, t, scale=t ** -0.5)}
        self.inputs = {"x_h": rand(rows, h, scale=1.0), "x_q": rand(rows, q, scale=1.0),
                       "x_i": rand(rows, i, scale=1.0), "x_t": rand(rows, t, scale=1.0)}
        outs = {}
        for ph in schedule.phases:
            if ph.type in TILE_FEATURES:
                n = ph.out_features // 2 if ph.type == F.GATEUP else ph.out_features
                outs[self._out_key(ph)] = n
        regions = [(k, x.shape[1]) for k, x in self.inputs.items()] + list(outs.items())
        self.offsets, words = {}, 0
        for key, k in regions:  # 32-bit words; every region a multiple of 16 bytes
            if key == next(iter(outs)):
                self.first_output_word = words
            self.offsets[key] = (words, k)
            words += k * self.r8 // 2
        self.arena = torch.full((words + 4,), 0x7FC07FC0, dtype=torch.int32, device=device)
        for key, x in self.inputs.items():  # the inputs; the outputs stay poisoned (NaN)
            w0, k = self.offsets[key]
            self.arena[w0: w0 + k * self.r8 // 2] = chunk_major_rows(x, self.r8).view(
                torch.int32).reshape(-1)
        table = [unfused_row(-1, -1) for _ in schedule.phases]
        for ph in schedule.phases:
            if ph.type in TILE_FEATURES:
                table[ph.index] = unfused_row(self.offsets[self.INPUTS[ph.type]][0],
                                              self.offsets[self._out_key(ph)][0])
        self.phases = torch.tensor(table, dtype=torch.int32, device=device)
        self.packed = pack_frame_weights(schedule, self.weights)

    @staticmethod
    def _out_key(ph):
        owner = ph.pos if ph.type in (F.HEAD, F.PROJ) else ph.layer
        return (ph.type, owner)

    def io(self):
        return self.phases, self.arena

    def output(self, key):
        """[rows, N] bf16 of output ``key`` ((type, layer or position)) from the arena."""
        w0, n = self.offsets[key]
        buf = self.arena[w0: w0 + n * self.r8 // 2].view(torch.bfloat16)
        return from_chunk_major(buf, self.rows, n)

    def check(self) -> dict:
        """Every output against float64 of the same bf16 operands, within the derived bound
        (:func:`projection_error_ratio`); returns {name: worst |error| / bound} and "ok"."""
        by_type = {F.QKV: "qkv", F.O: "wo", F.GATEUP: "gate_up", F.DOWN: "down"}
        worst, ok = {}, True
        for key in [k for k in self.offsets if isinstance(k, tuple)]:
            type_, owner = key
            w = (self.weights["heads"][owner - 1] if type_ == F.HEAD else
                 self.weights["proj"] if type_ == F.PROJ else self.weights[by_type[type_]][owner])
            x = self.inputs[self.INPUTS[type_]].double()
            got = self.output(key).double()
            ratio = projection_error_ratio(x, w.double(), got, swiglu=type_ == F.GATEUP)
            name = f"{F.TYPE_NAMES[type_]}[{owner}]"
            worst[name] = ratio
            ok = ok and ratio <= 1.0
        worst["ok"] = ok
        return worst


def projection_error_ratio(x, w, got, swiglu: bool) -> float:
    """max |got - ref| / bound over the outputs (inf where got is not finite). ref is
    x · w^T in float64 (SwiGLU: silu(gate) · up). The bound is derived for bf16 operands, fp32
    accumulation and bf16 outputs: a sum s over K products (each exact in fp32) carries at most
    K · 2^-24 · sum |x_k w_k| of accumulation error, doubled here because the order of wgmma's
    adds is not documented (delta = K · 2^-23 · sum |x||w|); rounding to bf16 adds at most
    2^-8 |s|. So |y - ref| <= 2^-8 |ref| + 1.004 delta. SwiGLU: with dg, du the bounds of
    bf16(g), bf16(u) and |silu'| <= 1.1, act = bf16(bf16(silu(bf16 g)) · bf16 u) is off by at
    most 1.1 dg |u| + |silu g| du + 2^-7 |silu(g) u| + dg du (first order plus the product of
    the two errors), times 1.25 for the terms of higher order."""
    k = x.shape[1]
    ref = x @ w.T
    delta = k * 2.0 ** -23 * (x.abs() @ w.abs().T)
    if swiglu:
        n = w.shape[0] // 2
        gt, ut = ref[:, :n], ref[:, n:]
        dg = 2.0 ** -8 * gt.abs() + 1.004 * delta[:, :n]
        du = 2.0 ** -8 * ut.abs() + 1.004 * delta[:, n:]
        sg = gt * torch.sigmoid(gt)
        ref = sg * ut
        bound = 1.25 * (1.1 * dg * ut.abs() + sg.abs() * du + 2.0 ** -7 * (sg * ut).abs()
                        + dg * du)
    else:
        bound = 2.0 ** -8 * ref.abs() + 1.004 * delta
    err = (got - ref).abs()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((err / (bound + 1e-30)).max())




class ResidualStudy:
    """The residual stream through a frame's projections, fused as the real frame fuses it
    (``ProtocolRun(..., fused=True)``). Per position p its own stream h_p and ssq_p (the
    schedule lets positions 0 and 1 run side by side):

    * proj (p = 0): h_0 = bf16(bf16(x_t · P^T) + b), with its ssq partials;
    * positions >= 1 start from a given h_p (the embedding tasks get no inputs), its
      partials written by the host in the kernel's order;
    * per layer l: qkv_{l,p} = norm(h_p; in_norm_l) · Wqkv^T; h_p = bf16(h_p + bf16(x_q ·
      Wo^T)) (o reads a fixed input: the attention tasks get no inputs); act_{l,p} =
      SwiGLU(norm(h_p; post_norm_l) · Wgu^T); h_p = bf16(h_p + bf16(act_{l,p} · Wd^T));
    * head (p >= 1): logits_p = norm(h_p; final) · Head_p^T.

    :meth:`emulate` computes the same chain in fp32 torch with the kernel's roundings and its
    ssq order; :meth:`check` compares every output within ``tol`` of its largest value (the
    projections' fp32 sums are added in other orders, so a bf16 rounding may differ by an ulp
    and propagate)."""

    def __init__(self, schedule, seed: int = 0, device: str = "cuda"):
        cfg, rows = schedule.config, schedule.options.rows
        check_rows(rows)
        self.schedule, self.cfg, self.rows, self.r8 = schedule, cfg, rows, rows8(rows)
        g = torch.Generator(device=device).manual_seed(seed)

        def rand(*shape, scale=1.0, shift=0.0):
            return (torch.randn(*shape, generator=g, device=device) * scale + shift).to(
                torch.bfloat16)

        h, q, i, t, L, P = (cfg.hidden, cfg.q_dim, cfg.intermediate, cfg.talker_hidden,
                            cfg.layers, cfg.positions)
        self.weights = {
            "qkv": [rand(cfg.qkv_dim, h, scale=h ** -0.5) for _ in range(L)],
            "wo": [rand(h, q, scale=0.5 * q ** -0.5) for _ in range(L)],
            "gate_up": [rand(2 * i, h, scale=h ** -0.5) for _ in range(L)],
            "down": [rand(h, i, scale=0.5 * i ** -0.5) for _ in range(L)],
            "heads": [rand(cfg.vocab, h, scale=h ** -0.5) for _ in range(cfg.heads_drawn)],
            "proj": rand(h, t, scale=t ** -0.5)}
        self.norms = {"in": [rand(h, scale=0.05, shift=1.0) for _ in range(L)],
                      "post": [rand(h, scale=0.05, shift=1.0) for _ in range(L)],
                      "final": rand(h, scale=0.05, shift=1.0)}
        self.bias = rand(h, scale=0.1)
        self.x_t, self.x_q = rand(rows, t), rand(rows, q)
        self.h_start = [None] + [rand(rows, h) for _ in range(1, P)]
        r8 = self.r8
        regions = [("x_t", t * r8 // 2), ("x_q", q * r8 // 2), ("bias", h // 2),
                   ("final", h // 2)]
        regions += [((n, l), h // 2) for n in ("in", "post") for l in range(L)]
        regions += [(("h", p), h * r8 // 2) for p in range(P)]
        regions += [(("ssq", p), SSQ_TILES * r8) for p in range(P)]
        regions += [(("qkv", l, p), cfg.qkv_dim * r8 // 2) for l in range(L) for p in range(P)]
        regions += [(("act", l, p), i * r8 // 2) for l in range(L) for p in range(P)]
        regions += [(("logits", p), cfg.vocab * r8 // 2) for p in range(1, P)]
        self.offsets, words = {}, 0
        for key, n in regions:
            self.offsets[key] = words
            words += -(-n // 4) * 4  # 16-byte aligned regions
        self.arena = torch.full((words,), 0x7FC07FC0, dtype=torch.int32, device=device)
        self._put("x_t", chunk_major_rows(self.x_t, r8))
        self._put("x_q", chunk_major_rows(self.x_q, r8))
        self._put("bias", self.bias)
        self._put("final", self.norms["final"])
        for l in range(L):
            self._put(("in", l), self.norms["in"][l])
            self._put(("post", l), self.norms["post"][l])
        for p in range(1, P):
            self._put(("h", p), chunk_major_rows(self.h_start[p], r8))
            self._put(("ssq", p), ssq_partials(self.h_start[p], r8))
        self.phases = torch.tensor([self._row(ph) for ph in schedule.phases], dtype=torch.int32,
                                   device=device)
        self.packed = pack_frame_weights(schedule, self.weights)

    def _put(self, key, t):
        w0 = self.offsets[key]
        flat = t.contiguous().view(torch.int32).reshape(-1)
        self.arena[w0: w0 + flat.numel()] = flat

    def _row(self, ph) -> list:
        """The real frame's row (kernels.depth.frame.table.phase_row) but o's input, a fixed
        x_q, and no inputs for the attention and embedding tasks (they wait and signal only)."""
        o, p = self.offsets, ph.pos
        if ph.type == F.O:
            return table_row(o["x_q"], o[("h", p)], resid_word=o[("h", p)],
                             resid_kind=RESID_ROWS, ssq_out_word=o[("ssq", p)])
        if ph.type in (F.ATTN, F.EMBED):
            return unfused_row(-1, -1)
        return phase_row(ph, o, self.cfg)

    def io(self):
        return self.phases, self.arena

    def output(self, key, n: int):
        """[rows, n] bf16 of chunk-major region ``key`` from the arena."""
        w0 = self.offsets[key]
        buf = self.arena[w0: w0 + n * self.r8 // 2].view(torch.bfloat16)
        return from_chunk_major(buf, self.rows, n)

    def emulate(self) -> dict:
        """{key: [rows, n] bf16} of every output the frame leaves: h_p, qkv_{l,p}, act_{l,p},
        logits_p, in fp32 torch with the kernel's rounding points and ssq order."""
        cfg, W = self.cfg, self.weights
        out = {}

        def mm(x, w):
            return (x.float() @ w.float().T).to(torch.bfloat16)

        for p in range(cfg.positions):
            if p == 0:
                hp = (mm(self.x_t, W["proj"]).float() + self.bias.float()).to(torch.bfloat16)
            else:
                hp = self.h_start[p]
            for l in range(cfg.layers):
                out[("qkv", l, p)] = mm(frame_rms_norm(hp, self.norms["in"][l], cfg.rms_eps),
                                        W["qkv"][l])
                hp = (hp.float() + mm(self.x_q, W["wo"][l]).float()).to(torch.bfloat16)
                gu = frame_rms_norm(hp, self.norms["post"][l], cfg.rms_eps).float() \
                    @ W["gate_up"][l].float().T
                act = swiglu_reference(gu[:, :cfg.intermediate], gu[:, cfg.intermediate:])
                out[("act", l, p)] = act
                hp = (hp.float() + mm(act, W["down"][l]).float()).to(torch.bfloat16)
            out[("h", p)] = hp
            if p >= 1:
                out[("logits", p)] = mm(frame_rms_norm(hp, self.norms["final"], cfg.rms_eps),
                                        W["heads"][p - 1])
        return out

    def widths(self) -> dict:
        c = self.cfg
        return {"h": c.hidden, "qkv": c.qkv_dim, "act": c.intermediate, "logits": c.vocab}

    def check(self, tol: float = 0.01) -> dict:
        """{output name: max |kernel - emulation| / max |emulation|} and "ok" (all <= tol)."""
        ref = self.emulate()
        worst, ok = {}, True
        for key, want in ref.items():
            got = self.output(key, self.widths()[key[0]]).float()
            scale = float(want.float().abs().max()) or 1.0
            err = float((got - want.float()).abs().max()) / scale
            if got.isnan().any():
                err = float("inf")
            worst["/".join(map(str, key))] = err
            ok = ok and err <= tol
        worst["ok"] = ok
        return worst


def ssq_partials(h, r8: int):
    """[SSQ_TILES][r8] fp32 row sums of squares of bf16 ``h`` [rows, hidden] per tile of 16
    features, in the frame kernel's order of additions: each quad thread q sums its features
    2q, 2q + 1, 8 + 2q, 9 + 2q of the tile in that order, then the quad adds (t0 + t1) +
    (t2 + t3). (ptxas may contract the kernel's squares into FMAs, so the bits can differ.)"""
    rows, n = h.shape
    x = h.float().reshape(rows, n // 16, 2, 4, 2)  # [row, tile, n8 block j, quad q, e]
    sq = x * x
    t = ((sq[:, :, 0, :, 0] + sq[:, :, 0, :, 1]) + sq[:, :, 1, :, 0]) + sq[:, :, 1, :, 1]
    tot = (t[..., 0] + t[..., 1]) + (t[..., 2] + t[..., 3])  # [row, tile]
    out = torch.zeros(SSQ_TILES, r8, dtype=torch.float32, device=h.device)
    out[:, :rows] = tot.T
    return out


def frame_rms_norm(x, gamma, eps: float):
    """The frame's RMSNorm of bf16 rows: r from the ssq partials summed in tile order, then the
    reference's roundings (numerics.rmsnorm.rms_apply)."""
    rows, n = x.shape
    parts = ssq_partials(x, rows)  # [tiles, rows]
    total = torch.zeros(rows, dtype=torch.float32, device=x.device)
    for j in range(parts.shape[0]):
        total = total + parts[j]
    return rms_apply(x, gamma, torch.rsqrt(total * (1.0 / n) + eps)[:, None])


def swiglu_reference(gate, up):
    """SwiGLU of fp32 sums as the reference rounds it (models.codepredictor: silu of the bf16
    gate, times the bf16 up, in bf16)."""
    return torch.nn.functional.silu(gate.to(torch.bfloat16)) * up.to(torch.bfloat16)


# ---- the projection tiles' A/B knobs -----------------------------------------------------------
ABLATIONS = ("", "no_mma", "no_page_wait")


@dataclass(frozen=True)
class TileStudy:
    """Knobs of the projection tiles still under A/B (scripts/frame_tiles_ab.py). ``k_stage``:
    K elements an activation stage (0: the plan's, schedules.plan.frame_k_stage; else 256 or
    512). ``ablate`` (timing only, the outputs are wrong): "no_mma" issues no wgmma,
    "no_page_wait" computes on the ring's pages without waiting for them to land. (The
    activation buffers are the plan's FRAME_ACT_BUFFERS: as many as fit lost its A/B,
    notes/depth-frame.md.)"""
    ablate: str = ""
    k_stage: int = 0

    def __post_init__(self):
        if self.ablate not in ABLATIONS:
            raise ValueError(f"ablate {self.ablate!r}: choose from {ABLATIONS}")
        if self.k_stage not in (0, 256, 512):
            raise ValueError(f"{self}: k_stage 0 (the plan's), 256 or 512")


class TileStudyKernel(FrameKernel):
    """The frame kernel of a :class:`FrameBuild` with a :class:`TileStudy`'s knobs (``study``)."""

    def __init__(self, build: FrameBuild, *, study: TileStudy):
        self.study, self.ablate = study, study.ablate
        super().__init__(build)

    def _k_stage(self, rows: int) -> int:
        return self.study.k_stage or super()._k_stage(rows)


class TileStudyRun(ProtocolRun):
    """A frame launch (ProtocolRun's arguments) of a :class:`TileStudyKernel` with ``study``."""

    def __init__(self, schedule, *, study: TileStudy, **kwargs):
        self.study = study
        super().__init__(schedule, **kwargs)

    def _frame_kernel(self, build: FrameBuild) -> FrameKernel:
        return TileStudyKernel(build, study=self.study)


# (timing only; "no_page_wait" also lets a page go back, and the loader re-arm it, while its
# copy may still be in flight: its times are estimates, and it relies on the ring running ahead)
FRAME_ABLATIONS = ("", "no_store", "no_mma", "no_page_wait")


class FrameStudyKernel(FrameKernel):
    """The frame kernel of a :class:`FrameBuild` with only ``bodies`` (task types; None: all)
    compiled, or with a step of the projection tiles left out (``ablate``, timing only: the
    outputs are wrong): "no_store" skips their output stores (the residual's ssq partials
    stay), "no_mma" their wgmmas, "no_page_wait" their waits on the weight pages. The tasks
    without a body keep their counter waits, weight pages, pair handoff and signal, so the
    walk and the ring run as in the whole frame (the code-size study and the ablations of
    scripts/frame_code_size.py)."""

    def __init__(self, build: FrameBuild, *, bodies=None, ablate: str = ""):
        if ablate not in FRAME_ABLATIONS:
            raise ValueError(f"ablate {ablate!r}: choose from {FRAME_ABLATIONS}")
        if bodies is not None and not set(bodies) <= set(range(len(F.TYPE_NAMES))):
            raise ValueError(f"bodies {sorted(bodies)!r}: task types, the ints of "
                             "schedules.depth_frame (F.ATTN, F.O, ...)")
        self.bodies = None if bodies is None else frozenset(bodies)
        self.ablate = ablate
        super().__init__(build)


class FrameStudyRun(ProtocolRun):
    """A frame launch (ProtocolRun's arguments) of a :class:`FrameStudyKernel`."""

    def __init__(self, schedule, *, bodies=None, ablate: str = "", **kwargs):
        self.bodies = None if bodies is None else frozenset(bodies)
        self.study_ablate = ablate
        super().__init__(schedule, **kwargs)

    def _frame_kernel(self, build: FrameBuild) -> FrameKernel:
        return FrameStudyKernel(build, bodies=self.bodies, ablate=self.study_ablate)


def snapshot_outputs(out):
    """A copy of a frame's LoopOutput (its talker_sum and kv are views of the arena)."""
    return type(out)(out.codes.clone(), out.talker_sum.clone(),
                     [(k.clone(), v.clone()) for k, v in out.kv], out.logits.clone())


def same_bits(a, b) -> bool:
    """Codes, logits, Talker sum and KV of two LoopOutputs equal bit for bit (NaNs included)."""
    return (torch.equal(a.codes, b.codes) and torch.equal(a.logits.view(torch.int32),
                                                          b.logits.view(torch.int32))
            and torch.equal(a.talker_sum.view(torch.int16), b.talker_sum.view(torch.int16))
            and all(torch.equal(k.view(torch.int16), k1.view(torch.int16)) and
                    torch.equal(v.view(torch.int16), v1.view(torch.int16))
                    for (k, v), (k1, v1) in zip(a.kv, b.kv)))
