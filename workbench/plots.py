"""PNG plots of summaries (matplotlib: the ``plots`` extra, ``pip install -e '.[plots]'``).

``headline_png``: any summary's numeric headline, one panel per unit (µs, GB/s, a ratio, ...:
bars of different units never share an axis), at most MAX_PANELS panels of MAX_BARS bars, the
headline's shallower figures first; what is left out is counted on the panel (``wb results
show`` lists everything).
``p0_ratio_png``: p0-baseline's speed ratios per projection and M, with the targets, in three
panels: vs cuBLAS bf16, vs quack's W4A16 GEMM, end to end vs Comfy (results/p0-baseline.png;
the experiment can call it after writing its summary).
``p1_stream_png``: p1-stream-a's ratios per projection and M (P1 against the unfused path, against
P0's GEMM alone and against Comfy), with the targets.
``p2_capacity_png``: p2-ring-capacity's latency against ring capacity per projection (the ring's
total over the complete path, and one chunk's latency).
``frame_timeline_png``: one traced depth frame, the tasks of every CTA over time coloured by
type (experiments/frame_protocol.py draws it beside its summary).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workbench import WorkbenchError
from workbench import results as R


def _pyplot():
    try:  # here, not at the top: matplotlib is optional (the plots extra)
        import matplotlib
    except ImportError:
        raise WorkbenchError("plotting needs matplotlib, which is not installed "
                             "(pip install -e '.[plots]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): the backend is chosen before pyplot loads

    return plt


MAX_PANELS = 4  # a plot a person reads at a glance; `wb results show` has the rest
MAX_BARS = 12
LABEL_CHARS = 44  # a bar's label, cut in the middle beyond this
# the unit a key names, by its last "_"-separated word (a headline key's own words, nearest
# first: "critical_path_us.down" is in µs)
UNIT_WORDS = {"us": "µs", "ms": "ms", "s": "s", "gbps": "GB/s", "tbps": "TB/s",
              "tflops": "TFLOP/s", "bytes": "bytes", "mib": "MiB", "gib": "GiB", "pct": "%"}
RATIO_WORDS = {"error", "ratio", "fraction", "speedup", "over", "x"}


@dataclass
class Panel:
    unit: str
    cases: dict[str, float]  # label: value, at most MAX_BARS
    left_out: int = 0  # figures of this unit not drawn


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def unit_of(key: str) -> str:
    """The unit a dotted headline key names: "predicted_us.seed" -> "µs", "held_out.8.error"
    -> "ratio"; "no unit" when none of its parts names one."""
    for part in reversed(key.split(".")):
        words = part.lower().split("_")
        if words[-1] in UNIT_WORDS:
            return UNIT_WORDS[words[-1]]
        if "per" in words[1:-1]:  # a rate: "bytes_per_us_per_sm" -> "bytes/µs/sm"
            return "/".join(UNIT_WORDS.get(w, w) for w in words if w != "per")
        if RATIO_WORDS & set(words):
            return "ratio"
    return "no unit"


def headline_panels(summary: dict) -> tuple[list[Panel], int]:
    """(the panels of :func:`headline_png`, how many figures no panel shows). Panels in the
    order their units first appear; in each, the shallowest keys first (the headline's own
    figures before the calibration details nested under it)."""
    by_unit: dict[str, list[tuple[int, int, str, float]]] = {}
    for i, (key, value) in enumerate(R.flat_headline(summary).items()):
        if _number(value):
            by_unit.setdefault(unit_of(key), []).append((key.count("."), i, key, float(value)))
    panels, dropped = [], 0
    for unit, figures in by_unit.items():
        if len(panels) == MAX_PANELS:
            dropped += len(figures)
            continue
        figures.sort()
        shown = figures[:MAX_BARS]
        panels.append(Panel(unit, {R.clip(k, LABEL_CHARS, middle=True): v
                                   for _, _, k, v in shown}, len(figures) - len(shown)))
    return panels, dropped


def _caption(summary: dict) -> str:
    p = summary["provenance"]
    machine = R.machine_class(summary)
    machine = "no GPU" if machine == "none" else machine
    return (f"{summary['name']}: verdict {R.verdict_text(summary)}; {machine}, "
            f"commit {str(p['commit'])[:10]}, {p['utc']}")


def _save(fig, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


def headline_png(summary: dict, out: Path) -> Path:
    """One horizontal bar chart per unit (:func:`headline_panels`), the values beside the bars,
    the caption above the first panel (constrained layout keeps them apart)."""
    panels, dropped = headline_panels(summary)
    if not panels:
        raise WorkbenchError(f"summary '{summary['name']}' has no numeric headline to plot")
    plt = _pyplot()
    heights = [0.5 + 0.3 * len(p.cases) for p in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 0.9 + sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights}, layout="constrained")
    for ax, panel in zip(axes[:, 0], panels):
        labels, values = list(panel.cases), list(panel.cases.values())
        bars = ax.barh(range(len(values)), values, color="#4878a8")
        ax.set_yticks(range(len(values)), labels, fontsize=8)
        ax.invert_yaxis()
        more = f"  (+{panel.left_out} more, not drawn)" if panel.left_out else ""
        ax.set_title(f"{panel.unit}{more}", fontsize=9, loc="left")
        ax.bar_label(bars, labels=[R.fmt(v) for v in values], fontsize=8, padding=3)
        ax.margins(x=0.15)
    caption = _caption(summary)
    if dropped:
        caption += f"\n{dropped} figures in other units not drawn (wb results show)"
    fig.suptitle(caption, fontsize=9)
    try:
        return _save(fig, out)
    finally:
        plt.close(fig)


# p0-baseline's panels: (headline key, title, y label); the first must be measured to draw
P0_PANELS = (
    ("p0_over_cublas_bf16", "P0 GEMM vs cuBLAS bf16 on the dequantized operands",
     "cuBLAS bf16 time / P0 time"),
    ("p0_over_quack_w4a16", "P0 GEMM vs quack W4A16 (gemm_w4a16) on the same NVFP4 weights",
     "quack time / P0 time"),
    ("e2e_speedup_vs_comfy", "our NVFP4 linear vs Comfy Kitchen's Hopper path, end to end: "
     "bars eager, ticks under CUDA graphs", "Comfy time / ours"),
)
P0_NOT_RUN_PREFIX = {"p0_over_quack_w4a16": "quack_w4a16", "e2e_speedup_vs_comfy": "comfy_e2e"}


def _p0_panel(ax, rows, key, title, ylabel, projections, ms, targets, not_run) -> None:
    """One p0-baseline ratio per projection, a bar per M, each M's target a dashed line in its
    colour (one grey line for Ms that share it); a panel without figures says why."""
    ratio = {(r["projection"], r["M"]): r[key] for r in rows if key in r}
    ax.set_title(title, fontsize=9, loc="left")
    ax.set_ylabel(f"{ylabel}\n(> 1: ours faster)", fontsize=8)
    if not ratio:
        prefix = P0_NOT_RUN_PREFIX.get(key, key)
        why = [n for n in not_run if isinstance(n, str) and n.startswith(prefix)]
        ax.text(0.5, 0.5, R.clip(why[0], 110) if why else "not measured in this summary",
                transform=ax.transAxes, ha="center", va="center", fontsize=9, color="grey")
        ax.set_yticks([])
        return
    width = 0.8 / len(ms)
    drawn = list(ratio.values())
    for j, m in enumerate(ms):
        xs = [i + (j - (len(ms) - 1) / 2) * width for i in range(len(projections))]
        vals = [ratio.get((p, m), float("nan")) for p in projections]
        bars = ax.bar(xs, vals, width * 0.9, label=f"M = {m}", color=f"C{j}")
        ax.bar_label(bars, labels=[f"{v:.2f}" for v in vals], fontsize=7, padding=2)
        if key == "e2e_speedup_vs_comfy":  # the graph-replay figure on the same bar
            graph = {(r["projection"], r["M"]): r["e2e_speedup_vs_comfy_graph"] for r in rows
                     if "e2e_speedup_vs_comfy_graph" in r}
            ys = [graph.get((p, m), float("nan")) for p in projections]
            drawn += ys
            ax.plot(xs, ys, linestyle="none", marker="_", markersize=12, color="black",
                    label="under CUDA graphs" if j == 0 else None)
    by_target: dict[float, list] = {}  # one dashed line per target value, naming its Ms
    for j, m in enumerate(ms):
        target = targets.get(str(m), targets.get(m))
        if target is not None:
            by_target.setdefault(float(target), []).append((j, m))
    for target, js in by_target.items():
        ax.axhline(target, color=f"C{js[0][0]}" if len(js) == 1 else "grey", linestyle="--",
                   linewidth=1, label=f"target at M = {', '.join(str(m) for _, m in js)}: "
                   f"{target:.3g}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    finite = [v for v in drawn if v == v]  # not NaN
    ax.set_ylim(0, max(1.3, *finite, *by_target) * 1.12)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside: no bar hidden


def _ratio_panels_png(summary: dict, out: Path, panels: tuple) -> Path:
    """A summary's per-case ratios by projection and M, one panel per (headline key, title, y
    label) of ``panels`` (:func:`_p0_panel`), the cases being the measurements holding the
    first panel's key; a panel whose key no case holds says why (notes.not_run)."""
    rows = [r for r in summary["measurements"] if panels[0][0] in r]
    if not rows:
        raise WorkbenchError(f"summary '{summary['name']}' has no {panels[0][0]} "
                             "measurements")
    plt = _pyplot()
    projections = list(dict.fromkeys(r["projection"] for r in rows))
    ms = sorted({r["M"] for r in rows})
    targets = summary["parameters"].get("targets", {})
    not_run = (summary.get("notes") or {}).get("not_run") or []
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 4 * len(panels)), sharex=True,
                             layout="constrained")
    for ax, (key, title, ylabel) in zip(axes, panels):
        _p0_panel(ax, rows, key, title, ylabel, projections, ms, targets.get(key, {}), not_run)
    shapes = {r["projection"]: f"N={r['N']} K={r['K']}" for r in rows}
    axes[-1].set_xticks(range(len(projections)), [f"{p}\n{shapes[p]}" for p in projections],
                        fontsize=9)
    fig.suptitle(_caption(summary), fontsize=9)
    try:
        return _save(fig, out)
    finally:
        plt.close(fig)


def p0_ratio_png(summary: dict, out: Path) -> Path:
    """p0-baseline's speed ratios per projection and M (X's time / ours, > 1: ours faster), one
    panel each (:data:`P0_PANELS`): P0 vs cuBLAS bf16, P0 vs quack's W4A16 GEMM, our linear vs
    Comfy end to end; a bar per M, each M's target a dashed line in its colour. A column the
    run did not measure keeps its panel, with the reason from notes.not_run."""
    return _ratio_panels_png(summary, out, P0_PANELS)


P1_PANELS = (
    ("speedup_vs_unfused", "P1 (amax + the GEMM quantizing inside) vs amax + quantize + P0",
     "unfused time / P1 time"),
    ("p0_over_p1", "P1 vs P0's GEMM alone (target: P1 within 1.03x of its time)",
     "P0 GEMM time / P1 time"),
    ("speedup_vs_comfy", "P1 vs Comfy Kitchen's Hopper path, end to end, under CUDA graphs",
     "Comfy time / P1 time"),
)


def p1_stream_png(summary: dict, out: Path) -> Path:
    """p1-stream-a's ratios per projection and M (> 1: P1 faster), one panel each
    (:data:`P1_PANELS`), a bar per M, each M's target dashed; fc2 (pinned to P0) included."""
    return _ratio_panels_png(summary, out, P1_PANELS)


def p2_capacity_series(summary: dict) -> dict:
    """p2-ring-capacity's curves: per streamed projection, (capacity, total / complete) and
    (capacity, chunk µs) points in capacity order, from its ring measurements."""
    series: dict = {"relative": {}, "chunk_us": {}}
    for r in sorted((r for r in summary["measurements"] if r.get("path") == "ring"),
                    key=lambda r: (r["projection"], r["capacity"])):
        series["relative"].setdefault(r["projection"], []).append(
            (r["capacity"], r["total_us"] / r["complete_us"]))
        series["chunk_us"].setdefault(r["projection"], []).append((r["capacity"], r["chunk_us"]))
    if not series["relative"]:
        raise WorkbenchError(f"summary '{summary['name']}' has no ring measurements")
    return series


def p2_capacity_png(summary: dict, out: Path) -> Path:
    """p2-ring-capacity: latency against ring capacity, two panels: the ring's total over the
    complete quantize + P0 path (1.0 dashed: below it the ring is faster), and one chunk's
    latency in µs; a line per streamed projection, capacities on a log2 axis."""
    series = p2_capacity_series(summary)
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    panels = (("relative", "ring total / complete path (lower is faster)"),
              ("chunk_us", "one full chunk: quantize + GEMM (µs)"))
    for ax, (key, ylabel) in zip(axes, panels):
        for name, pts in series[key].items():
            ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o", label=name)
        ax.set_xscale("log", base=2)
        caps = sorted({c for pts in series[key].values() for c, _ in pts})
        ax.set_xticks(caps, [str(c) for c in caps])
        ax.set_xlabel("ring capacity (rows)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].axhline(1.0, color="grey", linestyle="--", linewidth=1)
    axes[1].set_yscale("log")
    fig.suptitle(_caption(summary), fontsize=9)
    try:
        return _save(fig, out)
    finally:
        plt.close(fig)


# summaries with a plot of their own (``wb results plot NAME``; ``--headline`` for the generic one)
def frame_timeline_png(timeline: list, title: str, out: Path) -> Path:
    """``timeline``: per CTA, its tasks as (type name, start µs, end µs) from the frame's
    first start; one row of bars a CTA (x: time), a colour per task type."""
    plt = _pyplot()
    types = sorted({name for tasks in timeline for name, _, _ in tasks})
    colours = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(types)}
    fig, ax = plt.subplots(figsize=(14, 7))
    for cta, tasks in enumerate(timeline):
        for n in types:
            spans = [(t0, max(t1 - t0, 0.01)) for name, t0, t1 in tasks if name == n]
            if spans:
                ax.broken_barh(spans, (cta - 0.4, 0.8), color=colours[n], linewidth=0)
    for n in types:
        ax.plot([], [], color=colours[n], linewidth=6, label=n)
    ax.legend(loc="upper right", ncol=len(types), fontsize=8)
    ax.set_xlabel("µs from the frame's first task")
    ax.set_ylabel("CTA")
    ax.set_ylim(-1, len(timeline))
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, out)


OWN_PLOTS = {"p0-baseline": p0_ratio_png, "p1-stream-a": p1_stream_png,
             "p2-ring-capacity": p2_capacity_png}


def summary_png(summary: dict, out: Path, headline: bool = False) -> Path:
    """The summary's own plot when it has one (and ``headline`` is False), else its headline."""
    plot = headline_png if headline else OWN_PLOTS.get(summary["name"], headline_png)
    return plot(summary, out)
