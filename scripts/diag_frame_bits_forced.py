"""(Run from a worktree of 5be45d6: it needs FastLoop options later removed.) Item 9, second probe: the failing assertion was the teacher-forced one (codes are the forced ones,
so 'codes equal, logits not'), whose codes come from the global CUDA RNG, i.e. from process
history. Compare the teacher-forced logits of the variants over many fixed code sets."""
import json, os, sys, time, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
OUT = os.environ.get("OUT", "/tmp")
log = open(os.path.join(OUT, "diag-forced.log"), "a")
def say(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); log.write(s + "\n"); log.flush()
from models.codepredictor import random_weights
from configs.codepredictor import QWEN3_TTS_1P7B as C
from models.fast_loop import FastLoop, FastWeights
w = random_weights(C, seed=0, dtype=torch.bfloat16).to(device="cuda")
fw = FastWeights(w)
variants = {"serial_notable": dict(prefill="serial", qkv_table=False),
            "overlap_notable": dict(prefill="overlap", qkv_table=False),
            "overlap_table": dict(prefill="overlap", qkv_table=True),
            "serial_table": dict(prefill="serial", qkv_table=True)}
report = {}
for R in (128, 64, 16):
    g = torch.Generator().manual_seed(R + 5)
    h = torch.randn(R, C.talker_hidden, generator=g).to("cuda", torch.bfloat16)
    g0 = torch.randint(0, 3072, (R,), generator=g).cuda()
    loops = {k: FastLoop(fw, R, teacher_forced=True, **kw) for k, kw in variants.items()}
    rows = []
    for trial in range(16):
        codes = torch.randint(0, C.vocab, (R, 15), generator=torch.Generator().manual_seed(1000 + trial)).cuda()
        outs = {k: loop(h, g0, codes=codes) for k, loop in loops.items()}
        outs = {k: (o.logits.clone(), o.talker_sum.clone(), [kv[0].clone() for kv in o.kv]) for k, o in outs.items()}
        ref = outs["serial_notable"]
        row = {}
        for k, o in outs.items():
            if k == "serial_notable": continue
            d = (o[0] != ref[0])
            if d.any():
                per_s = d.flatten(2).any(2)  # [R, 15]
                first_s = int(per_s.any(0).nonzero()[0])
                bad_rows = per_s[:, first_s].nonzero().flatten().tolist()
                kd = [int((a != b).sum()) for a, b in zip(o[2], ref[2])]
                row[k] = {"n": int(d.sum()), "max": float((o[0] - ref[0]).abs().max()), "first_pos": first_s,
                          "rows": bad_rows[:8], "codes_at_first": [int(codes[r, max(first_s - 1, 0)]) for r in bad_rows[:8]],
                          "kdiff_per_layer": kd}
            else:
                row[k] = "equal"
        rows.append(row)
        say(R, trial, json.dumps(row))
    report[str(R)] = rows
    del loops
    torch.cuda.empty_cache()
json.dump(report, open(os.path.join(OUT, "diag-forced.json"), "w"), indent=1)
