"""Standalone NVFP4 quantize kernel: bit-exactness and bandwidth.

Bytes for [M, K] bf16: read 2·M·K, write M·K/2 (packed) + M·K/16 (scales) = 2.5625·M·K bytes.
Floor at the 4.24 TB/s copy ceiling: 122 µs at [37810, 5376], 17.7 µs at [2048, 14336].
The arithmetic (~25 integer/fp32 ops per element) is far under the ALU limit, so the kernel
should be memory-bound; Comfy Kitchen's CUDA kernel took ~1.3 ms at [37810, 5376] (about 10x
the floor, h200-anchors.md). Baselines in the same run: a copy of the same bytes, and the torch
reference numerics.nvfp4.quantize on the GPU.
"""
from __future__ import annotations

import torch

from experiments._common import need_gpu, parser, progress, run_main
from kernels.nvfp4.quantize import QuantizeNvfp4Kernel, quantize_nvfp4
from numerics import nvfp4
from validators.tiles import make_tile, tensor_scale_for
from workbench import results as R
from workbench.timing import COPY_CEILING_BPS, bench

SHAPES = [(37810, 5376), (2048, 14336), (128, 5376)]
CONFIGS = [(8, 1), (8, 2), (4, 2), (4, 4), (8, 4), (16, 2), (2, 4)]  # (rows/CTA, rows/thread)
NOTES = {
    "prediction": "v1 (threshold compares, ~39 SASS instructions per element) measured 347 µs at "
                  "[37810, 5376]: ALU-bound (7.9 G thread-instructions ~ 240 µs at 1.98 GHz) and "
                  "~190 µs of host overhead per call (DLPack wrappers). v2: FFMA rounding onto the "
                  "E2M1 grid (~15 instructions per element), an integer block amax, raw pointers. "
                  "Predicted ~120 µs of ALU work against a 123 µs memory floor, so 140-160 µs "
                  "(0.75-0.85 of the ceiling) at [37810, 5376] and ~25 µs at [2048, 14336]. "
                  "v2 measured 179 µs / 28.5 µs (0.69 / 0.62). v3: a 2-D thread map (no integer "
                  "division), the binade clamp done with two FMNMX, shifts for the swizzle: "
                  "~290 SASS instructions per 16-element block on the fast path, predicted "
                  "~150 µs (0.8). v3 measured 150.9 µs (0.81) and 23.8 µs (0.75). v4 (this run): "
                  "the launch shape swept per shape (rows per CTA, rows per thread), predicted "
                  "~21 µs at [2048, 14336] where wave tails and the launch gap weigh more. "
                  "v4 measured 152 µs / 24.2 µs: the launch shape does not matter (all within "
                  "5%), so the kernel is still issue-bound. v5 (this run): blocks whose scale is "
                  "normal and unsaturated (the usual case) skip the saturating min and take signs "
                  "from the input words with PRMT, ~150 instead of ~186 fast-path instructions "
                  "per block: predicted ~135 µs (0.9) and ~21.5 µs (0.82). v5 measured 131.2 µs "
                  "(0.936) and 22.2 µs (0.799). v6 (this run): the block amax with "
                  "max.NaN.xorsign.abs on bf16x2 (|x| for free, NaN-propagating so it still "
                  "flags NaN blocks): ~5 fewer instructions per block, predicted ~2% faster, "
                  "0.81-0.82 at [2048, 14336].",
}


def main(argv=None) -> int:
    return run_main(_main, argv)


def _check_exact(M, K, dtype, gen, kinds=("normal", "lognormal", "ties", "special")):
    """Kernel vs the CUDA reference on fresh data of every kind; poisoned outputs; guard rows."""
    out = {}
    for i, kind in enumerate(kinds):
        seed = int(torch.randint(0, 2**30, (1,), generator=gen, device="cuda"))
        x = make_tile(kind, M, K, dtype, seed, device="cuda")
        g = tensor_scale_for(x)
        gd = torch.tensor([g], device="cuda")
        q_ref, s_ref = nvfp4.quantize(x, g, pad_16x=True)
        # poisoned caller buffers with 16 guard rows before and after
        guard = 16
        Mp = q_ref.shape[0]
        q_buf = torch.full((Mp + 2 * guard, K // 2), 0xAB, dtype=torch.uint8, device="cuda")
        s_buf = torch.full(nvfp4.scale_shape(Mp + 2 * guard, K), 0xCD, dtype=torch.uint8,
                           device="cuda")
        quantize_nvfp4(x, gd, out=(q_buf, s_buf), row_offset=guard)
        q_k = q_buf[guard:guard + M]
        s_valid = nvfp4.from_blocked(s_buf, Mp + 2 * guard, K // 16)[guard:guard + M]
        s_ref_valid = nvfp4.from_blocked(s_ref.view(torch.uint8), Mp, K // 16)[:M]
        packed_bad = int((q_k != q_ref[:M]).sum())
        scale_bad = int((s_valid != s_ref_valid).sum())
        guard_ok = bool((q_buf[:guard] == 0xAB).all() and (q_buf[guard + M:] == 0xAB).all())
        s_all = nvfp4.from_blocked(s_buf, Mp + 2 * guard, K // 16)
        guard_ok &= bool((s_all[:guard] == 0xCD).all() and (s_all[guard + M:] == 0xCD).all())
        # the allocating path, twice (deterministic)
        q1, s1 = quantize_nvfp4(x, gd, pad_16x=True)
        q2, s2 = quantize_nvfp4(x, gd, pad_16x=True)
        alloc_ok = (torch.equal(q1, q_ref) and torch.equal(s1.view(torch.uint8),
                                                           s_ref.view(torch.uint8))
                    and torch.equal(q1, q2) and torch.equal(s1.view(torch.uint8),
                                                            s2.view(torch.uint8)))
        out[kind] = {"packed_mismatches": packed_bad, "scale_mismatches": scale_bad,
                     "guards_untouched": guard_ok, "allocating_path_exact_and_repeatable": alloc_ok,
                     "elements": M * K}
    return out


def _main(argv) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    need_gpu("quantize-kernel")
    best, sweep = None, []
    shapes = SHAPES[:1] + SHAPES[2:] if args.quick else SHAPES
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    rows, gates, headline_frac, headline_gbps = [], {}, {}, {}
    for (M, K) in shapes:
        name = f"{M}x{K}"
        progress(f"quantize {name}: exactness (4 kinds, poisoned buffers, guard rows)")
        exact = _check_exact(M, K, torch.bfloat16, gen)
        ok = all(v["packed_mismatches"] == 0 and v["scale_mismatches"] == 0 and
                 v["guards_untouched"] and v["allocating_path_exact_and_repeatable"]
                 for v in exact.values())
        gates[f"exact:{name}"] = R.gate(ok, "; ".join(
            f"{k}: {v['packed_mismatches']}+{v['scale_mismatches']} bytes differ, guards "
            f"{'ok' if v['guards_untouched'] else 'TOUCHED'}" for k, v in exact.items()))
        nbytes = int(M * K * (2 + 0.5 + 1 / 16))
        n_sets = max(1, -(-3 * 60 * 2**20 // nbytes))
        xs = [torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
              for _ in range(n_sets)]
        gs = [nvfp4.global_scale(x).reshape(1) for x in xs]
        Mp = -(-M // 16) * 16
        outs = [(torch.zeros(Mp, K // 2, dtype=torch.uint8, device="cuda"),
                 torch.zeros(nvfp4.scale_shape(Mp, K), dtype=torch.uint8, device="cuda"))
                for _ in range(n_sets)]
        sets = list(zip(xs, gs, outs))
        if M >= 2048:  # pick the launch config per shape, by device time
            for cfg in CONFIGS:
                kc = QuantizeNvfp4Kernel("bfloat16", *cfg)
                t = bench(lambda x, g, o: quantize_nvfp4(x, g, out=o, config=kc), sets,
                          graph=True, repeat=False)
                sweep.append({"shape": [M, K], "rows_per_cta": cfg[0],
                              "rows_per_thread": cfg[1], "median_us": t.median_us})
                progress(f"config {cfg}: {t.median_us:.1f} µs")
            b = min((r for r in sweep if r["shape"] == [M, K]), key=lambda r: r["median_us"])
            best = QuantizeNvfp4Kernel("bfloat16", b["rows_per_cta"], b["rows_per_thread"])
        progress(f"quantize {name}: timing over {n_sets} buffer sets")
        t_k = bench(lambda x, g, o: quantize_nvfp4(x, g, out=o, config=best), sets, graph=True)
        t_host = bench(lambda x, g, o: quantize_nvfp4(x, g, out=o, config=best), sets)
        # a copy that reads and writes nbytes in total, the same traffic as the kernel
        dst = [torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda") for _ in xs]
        src = [x.view(-1)[: nbytes // 4] for x in xs]
        t_c = bench(lambda d, s: d.copy_(s), list(zip(dst, src)), graph=True)
        ref_fn = (lambda x, g: nvfp4.quantize(x, g, pad_16x=True))
        t_r = bench(ref_fn, [(xs[0], gs[0])], rep_ms=50, repeat=False) if M * K <= 2**28 \
            else None
        gbps = nbytes / (t_k.median_us * 1e-6) / 1e9
        frac = gbps * 1e9 / COPY_CEILING_BPS
        headline_frac[name] = round(frac, 3)
        headline_gbps[name] = round(gbps, 1)
        rows.append({"shape": [M, K], "dtype": "bfloat16", "bytes_moved": nbytes,
                     "floor_us": nbytes / COPY_CEILING_BPS * 1e6, "kernel": t_k.as_dict(),
                     "host_path_per_call": t_host.as_dict(),
                     "config": [best.rows_per_cta, best.rows_per_thread],
                     "copy_same_bytes": t_c.as_dict(),
                     "torch_reference": t_r.as_dict() if t_r else None,
                     "gbps": gbps, "fraction_of_copy_ceiling": frac, "exactness": exact})
        if M >= 2048:
            gates[f"bandwidth>=0.8:{name}"] = R.gate(frac >= 0.8, f"{frac:.3f} of 4.24 TB/s")
        del xs, gs, outs, dst, src
        torch.cuda.empty_cache()
    big = rows[0]
    notes = dict(NOTES, outcome="; ".join(
        f"{r['shape'][0]}x{r['shape'][1]}: {r['kernel']['median_us']:.1f} µs = {r['gbps']:.0f} "
        f"GB/s ({r['fraction_of_copy_ceiling']:.2f} of ceiling)" for r in rows))
    summary = R.make_summary(
        "quantize-kernel",
        parameters={"shapes": shapes, "quick": args.quick, "config_sweep": sweep,
                    "timing": "kernel: CUDA-graph replay (device time); host_path_per_call: "
                              "events around each Python call"},
        measurements=rows,
        headline={"fraction_of_copy_ceiling": headline_frac, "gbps": headline_gbps,
                  "elements_checked": sum(v["elements"] for r in rows
                                          for v in r["exactness"].values())},
        gates=gates, seeds={"torch": args.seed}, notes=notes)
    path = R.write(summary, args.results_dir)
    print(R.format_table([[f"{r['shape'][0]}x{r['shape'][1]}", r["kernel"]["median_us"],
                           r["floor_us"], r["gbps"], r["fraction_of_copy_ceiling"],
                           sum(v["packed_mismatches"] + v["scale_mismatches"]
                               for v in r["exactness"].values())] for r in rows],
                         ["shape", "kernel_us", "floor_us", "GB/s", "of_ceiling", "bad_bytes"]))
    print(f"wrote {path} (verdict {summary['verdict']}; big shape {big['gbps']:.0f} GB/s)")
    return 0 if summary["verdict"] == "pass" else 1


if __name__ == "__main__":
    raise SystemExit(main())
