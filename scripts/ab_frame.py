"""Same-run A/B of whole fast-loop frames: builds one FastLoop per variant (a
schedules.plan_variant.FrameVariant's fields; ``--instances N``: N each) at a row count and
times them in turn, several rounds, so drift hits all alike. Identical builds differ by up to
~60 µs a frame (buffer placement: notes/fast-loop.md v10v), so a difference below that needs
several instances. Tune on the frame, not on a kernel alone (notes/fast-loop.md, v8d: an
isolated 1.7 µs win was a 90 µs frame loss under PDL). A variant that wins goes into
schedules/plan.py's tables.

    python3 scripts/ab_frame.py --rows 64 --variant "" --variant pdl=False
    python3 scripts/ab_frame.py --rows 64 --variant "" --variant "tiles={'qkv': {'warps': 4}}"
    python3 scripts/ab_frame.py --rows 32 --variant "" \
        --variant "mainloops={'gate_up': 'rwgmma_tma', 'qkv': 'rwgmma_tma'}"
    python3 scripts/ab_frame.py --rows 128 --variant "" --variant "parts=()"
    python3 scripts/ab_frame.py --rows 1 --variant "" --variant "" --instances 3  # A/A
"""
import argparse
import ast
import dataclasses

import torch

from models.codepredictor import random_weights
from models.fast_loop import FastLoop, FastWeights
from models.sampler import Sampler
from schedules.plan_variant import FrameVariant, variant_plan
from workbench.results import provenance_line
from workbench.timing import bench


def _top_level_items(text: str) -> list:
    """Splits on the commas outside brackets, so values may be dicts or lists."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "[{(") - (ch in "]})")
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    return [t for t in items + [text[start:]] if t.strip()]


def parse_variant(text: str) -> dict:
    """'a=1,b=True,c=torch' -> {'a': 1, 'b': True, 'c': 'torch'}; values may be Python
    literals with commas (tiles={'qkv': {'warps': 4}, 'gate_up': {'splits': 8}}); '' -> {}."""
    out = {}
    for item in _top_level_items(text):
        key, _, value = item.partition("=")
        try:
            out[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = value.strip()
    return out


def frame_variant(text: str, **defaults) -> FrameVariant:
    """A ``--variant`` text (``parse_variant``; its knobs over ``defaults``) as a FrameVariant;
    ValueError naming the knobs a FrameVariant takes for any other."""
    knobs = {**defaults, **parse_variant(text)}
    fields = [f.name for f in dataclasses.fields(FrameVariant)]
    unknown = sorted(set(knobs) - set(fields))
    if unknown:
        raise ValueError(f"variant {text!r}: unknown knobs {unknown}; a FrameVariant takes "
                         f"{fields}")
    return FrameVariant(**knobs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--variant", action="append", default=[],
                    help="FrameVariant knobs, e.g. pdl=False (repeat; '' = the plan)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--instances", type=int, default=1,
                    help="loops built per variant (each with its own buffers): the spread "
                         "between identical builds, up to ~60 µs a frame on the H200, is the "
                         "resolution of a one-instance A/B")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.instances < 1 or args.rounds < 1:
        ap.error("--instances and --rounds must be at least 1")
    variants = args.variant or [""]
    try:  # every variant checked before any work
        built = [frame_variant(v) for v in variants]
    except ValueError as e:
        ap.error(str(e))
    print(provenance_line({"weights": args.seed}), flush=True)
    w = random_weights(seed=args.seed, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    R = args.rows
    g = torch.Generator(device="cuda").manual_seed(R)
    h = torch.randn(R, w.config.talker_hidden, device="cuda", generator=g).to(torch.bfloat16)
    g0 = torch.randint(0, 2048, (R,), device="cuda", generator=g)
    # one entry per (variant, instance), duplicates kept (an A/A test repeats a variant); the
    # instances of all variants are interleaved in every round, so drift hits all alike
    names = [v or "defaults" for v in variants]
    loops = []
    for _ in range(args.instances):
        for j, v in enumerate(built):
            try:
                loops.append((j, FastLoop(fw, R, Sampler(R, seeds=list(range(R)), device="cuda"),
                                          plan=variant_plan(R, v))))
            except ValueError as e:  # refused before any launch (e.g. by the plan): time the others
                print(f"variant {names[j]} refused: {e}", flush=True)
    times = [[] for _ in loops]
    for rnd in range(args.rounds):
        for (j, fl), ts in zip(loops, times):
            ts.append(bench(lambda fl=fl: fl(h, g0), warmup_ms=100, rep_ms=400).median_us)
            print(f"round {rnd} {names[j]}: {ts[-1]:.0f} µs", flush=True)
    for line in summary_lines(R, names, [j for j, _ in loops], times):
        print(line)


def summary_lines(rows: int, names: list, variant_of: list, times: list) -> list:
    """One line per variant that was built: the median of its rounds, or with several
    instances (``variant_of[i]`` names instance i's variant) the mean of their medians and
    their range."""
    lines = []
    for j, name in enumerate(names):
        per_instance = sorted(_median(ts) for i, ts in zip(variant_of, times) if i == j)
        if len(per_instance) == 1:
            lines.append(f"{rows} rows {name}: median of rounds {per_instance[0]:.0f} µs")
        elif per_instance:
            lines.append(f"{rows} rows {name}: mean of {len(per_instance)} instances "
                         f"{sum(per_instance) / len(per_instance):.0f} µs (medians of rounds "
                         f"{per_instance[0]:.0f}-{per_instance[-1]:.0f})")
    return lines


def _median(xs: list) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


if __name__ == "__main__":
    main()
