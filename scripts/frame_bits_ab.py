"""The depth frame against another commit's frame: the same bits, and each one's time (issue
#37: a rebuild that promises the same arithmetic, such as item 4's rolled stage loops, must
give the same codes, logits, KV and Talker sums).

    python3 scripts/frame_bits_ab.py --old-tree DIR [--rows 1 16 64] [--rep-ms 300]

``DIR`` holds the other commit's code (``git archive <commit> | tar -x -C DIR``; results/
not needed). Its frame runs in a subprocess (``--dump FILE``: this script run from that tree
with the same arguments writes its outputs and times there), then this tree's frame runs on
the same seeded weights and inputs, greedy and teacher-forced, and every output is compared
bit for bit. Times are medians of CUDA-event timed launches (workbench.timing.bench) in each
process, sequential, not alternating: the decisive speed figures come from
experiments/depth_frame.py beside the fast loop.

Writes the record ``depth-frame-bits-ab.json`` (workbench.results.write_record) and prints a
table; exits 1 when any output differs.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _frames(root: Path, rows_list, rep_ms: float) -> dict:
    """{(rows, mode): (outputs as tensors on the CPU, median µs)} of the frame in ``root``."""
    sys.path.insert(0, str(root))
    from configs.codepredictor import QWEN3_TTS_1P7B as CFG
    from kernels.depth.frame import DepthFrame
    from models.codepredictor import depth_loop, random_weights
    from models.fast_loop import FastWeights
    from workbench.timing import bench

    import kernels.depth.frame as frame_code

    w = random_weights(CFG, seed=0, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    out = {"_frame_code": str(Path(frame_code.__file__).resolve())}  # which tree ran
    for rows in rows_list:
        g = torch.Generator(device="cuda").manual_seed(rows)
        h = torch.randn(rows, CFG.talker_hidden, generator=g, device="cuda").to(torch.bfloat16)
        g0 = torch.randint(0, CFG.talker_vocab, (rows,), generator=g, device="cuda")
        codes = depth_loop(w, h, g0).codes
        for mode in ("greedy", "given"):
            f = DepthFrame(fw, rows, teacher_forced=mode == "given")
            f.poison()
            o = f(h, g0, codes) if mode == "given" else f(h, g0)
            f.run.synchronize()
            assert f.run.check() == {"counters_at_expected": True, "combine_mismatches": 0}
            outputs = {"codes": o.codes.cpu(), "logits": o.logits.cpu(),
                       "talker_sum": o.talker_sum.cpu(),
                       "kv": [(k.cpu(), v.cpu()) for k, v in o.kv]}
            t = bench(f.launch, warmup_ms=50, rep_ms=rep_ms, repeat=False).median_us
            out[(rows, mode)] = (outputs, t)
            print(f"  rows {rows} {mode} {t:.0f} µs", flush=True)
            del f
        torch.cuda.empty_cache()
    return out


def _equal(a, b) -> dict:
    if len(a["kv"]) != len(b["kv"]) or any(
            x.shape != y.shape for (ka, va), (kb, vb) in zip(a["kv"], b["kv"])
            for x, y in ((ka, kb), (va, vb))):
        return {"kv_layout": False}
    same = {k: bool(torch.equal(a[k].view(torch.int16) if a[k].dtype == torch.bfloat16
                                else a[k], b[k].view(torch.int16)
                                if b[k].dtype == torch.bfloat16 else b[k]))
            for k in ("codes", "logits", "talker_sum")}
    same["kv"] = all(torch.equal(x.view(torch.int16), y.view(torch.int16))
                     for (ka, va), (kb, vb) in zip(a["kv"], b["kv"])
                     for x, y in ((ka, kb), (va, vb)))
    return same


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old-tree", type=Path)
    p.add_argument("--rows", type=int, nargs="*", default=[1, 16, 64])
    p.add_argument("--rep-ms", type=float, default=300)
    p.add_argument("--old-commit", default=None,
                   help="the commit the old tree was archived from (recorded)")
    p.add_argument("--dump", type=Path, help="(the old tree's run) write outputs here")
    args = p.parse_args(argv)
    if args.dump:
        torch.save(_frames(Path.cwd(), args.rows, args.rep_ms), args.dump)
        return 0
    if args.old_tree is None or not (args.old_tree / "kernels" / "depth").is_dir():
        p.error("--old-tree must be a checkout of another commit (kernels/depth/ inside)")
    old_tree = args.old_tree.resolve()  # the child runs from inside it
    if old_tree == ROOT:
        p.error("--old-tree is this tree: nothing to compare")
    sys.path.insert(0, str(ROOT))
    from workbench.results import provenance_line, write_record

    print(provenance_line())
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "old.pt"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(old_tree)] + [x for x in os.environ.get("PYTHONPATH", "").split(
                os.pathsep) if x and Path(x).resolve() != ROOT]))
        me = old_tree / "scripts" / Path(__file__).name
        if not me.exists():  # an older tree without this script: run ours from there
            me = Path(__file__).resolve()
        print(f"old tree {old_tree}:", flush=True)
        subprocess.run([sys.executable, str(me), "--dump", str(dump), "--rows",
                        *map(str, args.rows), "--rep-ms", str(args.rep_ms)],
                       env=env, cwd=old_tree, check=True)
        old = torch.load(dump, weights_only=False)  # our own file
    ran = old.pop("_frame_code", None)  # (an older copy of this script does not say)
    if ran is not None and not Path(ran).is_relative_to(old_tree):
        raise SystemExit(f"the old run imported {ran}, not the old tree {old_tree}")
    print("this tree:", flush=True)
    new = _frames(ROOT, args.rows, args.rep_ms)
    new.pop("_frame_code")
    cases = []
    for key, (o_new, t_new) in new.items():
        o_old, t_old = old[key]
        same = _equal(o_old, o_new)
        cases.append({"rows": key[0], "mode": key[1], "old_us": t_old, "new_us": t_new,
                      "equal": same, "all_equal": all(same.values())})
    path = write_record("depth-frame-bits-ab", {"parameters": {
        "rows": args.rows, "rep_ms": args.rep_ms, "old_tree": str(args.old_tree),
        "old_commit": args.old_commit},
        "cases": cases}, seeds={"weights": 0, "inputs": "rows"})
    print(f"{'rows':>4} {'mode':>6} {'old µs':>8} {'new µs':>8}  equal")
    for c in cases:
        print(f"{c['rows']:>4} {c['mode']:>6} {c['old_us']:>8.0f} {c['new_us']:>8.0f}  "
              f"{c['all_equal']} {c['equal']}")
    print(f"wrote {path}")
    return 0 if all(c["all_equal"] for c in cases) else 1


if __name__ == "__main__":
    raise SystemExit(main())
