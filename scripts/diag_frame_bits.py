"""(Run from a worktree of 5be45d6: it needs FastLoop options later removed.) Item 9 of issue #23: why a 128-row frame's bits changed after other GPU tests ran in the same
process. Probes (1) cuBLAS: the frame's own input projection h[64] @ proj_w^T on the default
stream, on new side streams, under graph capture on side streams; (2) the real 128-row loops
(serial vs overlap prefill, the variants the failing test compared); each before and after the
GEMM / quantize / numerics / amax GPU tests ran in this process. Writes $OUT/diag-bits.json."""
import hashlib, json, os, sys, time
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
OUT = os.environ.get("OUT", "/tmp")
log = open(os.path.join(OUT, "diag-bits.log"), "a")
def say(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); log.write(s + "\n"); log.flush()
def fp(*ts):
    h = hashlib.sha256()
    for t in ts: h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
from models.codepredictor import random_weights
from configs.codepredictor import QWEN3_TTS_1P7B as C
from models.fast_loop import FastLoop, FastWeights
from models.sampler import Sampler
w = random_weights(C, seed=0, dtype=torch.bfloat16).to(device="cuda")
fw = FastWeights(w)
g = torch.Generator().manual_seed(133)
h = torch.randn(128, C.talker_hidden, generator=g).to("cuda", torch.bfloat16)
g0 = torch.randint(0, 3072, (128,), generator=g).cuda()
def cublas_probe():
    res = {}
    for rows in (slice(0, 64), slice(64, 128), slice(0, 128), slice(0, 1)):
        x = h[rows]
        key = f"{rows.start}:{rows.stop}"
        ref = torch.add(x @ fw.proj_w.T, fw.proj_b)
        out = {"default": fp(ref)}
        for k in range(3):
            s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                y = torch.add(x @ fw.proj_w.T, fw.proj_b)
            torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
            out[f"side{k}"] = fp(y)
            s2 = torch.cuda.Stream(); s2.wait_stream(torch.cuda.current_stream())
            buf = torch.empty_like(ref)
            with torch.cuda.stream(s2):
                torch.add(x @ fw.proj_w.T, fw.proj_b, out=buf)
            torch.cuda.current_stream().wait_stream(s2)
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                torch.add(x @ fw.proj_w.T, fw.proj_b, out=buf)
            gr.replay(); torch.cuda.synchronize()
            out[f"graph{k}"] = fp(buf)
        res[key] = out
    return res
def loops_probe(tag):
    seeds = list(range(500, 628))
    variants = {"serial": dict(prefill="serial", qkv_table=False), "overlap": dict(prefill="overlap", qkv_table=False),
                "default": {}}
    res = {}
    for name, kw in variants.items():
        t = time.time()
        loop = FastLoop(fw, 128, Sampler(128, seeds=seeds, device="cuda"), **kw)
        o = loop(h, g0); torch.cuda.synchronize()
        res[name] = {"codes": fp(o.codes), "logits": fp(o.logits), "sum": fp(o.talker_sum),
                     "kv0": fp(o.kv[0][0]), "kv4": fp(o.kv[-1][0])}
        say(tag, name, res[name], f"{time.time()-t:.0f}s")
        del loop
    return res
report = {}
report["cublas_before"] = cublas_probe(); say("cublas before", json.dumps(report["cublas_before"]))
report["loops_before"] = loops_probe("before")
import pytest
t = time.time()
rc = pytest.main(["-q", "-x", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_gemm_nvfp4.py",
                  "tests/test_quantize_kernel.py", "tests/test_numerics.py", "tests/test_amax.py"])
say("pollution pytest rc", rc, f"{time.time()-t:.0f}s")
report["cublas_after"] = cublas_probe(); say("cublas after", json.dumps(report["cublas_after"]))
report["loops_after"] = loops_probe("after")
report["cublas_after2"] = cublas_probe()
json.dump(report, open(os.path.join(OUT, "diag-bits.json"), "w"), indent=1)
# verdict lines
for k in report["cublas_before"]:
    vals = set(report["cublas_before"][k].values()) | set(report["cublas_after"][k].values()) | set(report["cublas_after2"][k].values())
    say("cublas", k, "distinct results:", len(vals), report["cublas_before"][k]["default"], report["cublas_after"][k]["default"])
for v in report["loops_before"]:
    say("loop", v, "same before/after:", report["loops_before"][v] == report["loops_after"][v])
say("serial==overlap before:", report["loops_before"]["serial"] == report["loops_before"]["overlap"],
    "after:", report["loops_after"]["serial"] == report["loops_after"]["overlap"])
