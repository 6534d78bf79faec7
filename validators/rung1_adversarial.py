"""Rung 1: adversarial NVFP4 cases with expectations derived by hand from the spec.

Every case is one 16-element block; the expected scale byte and codes below were worked out
from nvfp4-numerics.md §1.3 (comments give the arithmetic), not produced by the code under test.
Then three sweeps: every bf16/fp16 value in [-6, 6] at encode factor 1 against RNE onto the E2M1
grid, every positive bf16/fp16 block amax for six g against the scalar transcription, and a MUFU
tie stress where an IEEE-reciprocal model would fail.
"""
from __future__ import annotations

import functools
import math

import torch

from numerics import nvfp4, scalar_spec
from numerics.formats import Format, e2m1_encode, round_to_format
from numerics.rcp import correction_table
from validators.base import RungResult, check, mismatch_detail

NAME = "adversarial"
INF, NAN = math.inf, math.nan
Z = [0.0] * 16


def _blk(*head):
    return list(head) + [0.0] * (16 - len(head))


# (name, block, g, expected scale byte, expected 16 codes)
CASES = [
    # amax 6, g 1: d = RN(6*RN(1/6)) = 1.0 -> 0x38; enc = rcp(1) = 1; 6 -> code 7
    ("unit", _blk(6.0), 1.0, 0x38, [7] + [0] * 15),
    # ties at encode factor 1: 0.25->0, 0.75->1.0(2), 1.25->1.0(2), 1.75->2.0(4), 2.5->2.0(4),
    # 3.5->4.0(6), 5->4.0(6); -0.25 and -0.0 keep the sign (0x8)
    ("e2m1-ties", _blk(6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.0), 1.0, 0x38,
     [7, 0, 2, 2, 4, 4, 6, 6, 8, 8] + [0] * 6),
    # just off the ties: 0.2500001 -> 0.5 (1), 0.7499999 -> 0.5 (1), 4.9999 -> 4 (6), 5.0001 -> 6 (7)
    ("e2m1-near-ties", _blk(-6, 0.25000003, 0.74999994, 4.9999, 5.0001, -5.0001), 1.0, 0x38,
     [0xF, 1, 1, 6, 7, 0xF] + [0] * 10),
    # all zero, g 1: d = 0 -> scale 0; enc = rcp(0) = inf -> FLT_MAX; 0*FLT_MAX = 0 -> codes 0
    ("all-zero", Z, 1.0, 0x00, [0] * 16),
    # signed zeros only: same scale 0, -0.0 * FLT_MAX = -0.0 -> 0x8
    ("signed-zeros", [-0.0, 0.0] * 8, 1.0, 0x00, [8, 0] * 8),
    # NaN ignored by the block amax (6 -> scale 1.0); NaN encodes as 0x7 (+6, sign dropped)
    ("nan-ignored", _blk(NAN, 6.0, -NAN), 1.0, 0x38, [7, 7, 7] + [0] * 13),
    # all NaN: amax NaN -> d NaN -> fminf -> 448 (0x7E); codes 0x7
    ("all-nan", [NAN] * 16, 1.0, 0x7E, [7] * 16),
    # inf in the block: d = inf -> 448 (0x7E); enc = rcp(448) = 1/448; inf -> 7, -inf -> 0xF,
    # 1/448 -> 0
    ("inf", _blk(INF, -INF, 1.0), 1.0, 0x7E, [7, 0xF, 0] + [0] * 13),
    # saturation: amax 6*1000 with g 1 -> d = 1000 -> fminf 448; enc = 1/448:
    # 6000/448 = 13.4 -> saturates to 6 (7); 448*2 = 896/448 = 2 -> code 4
    ("scale-saturates", _blk(6000.0, 896.0), 1.0, 0x7E, [7, 4] + [0] * 14),
    # subnormal scale: amax 6*2^-8 -> d = 2^-8 = 2 * 2^-9 -> code 0x02; enc = rcp(2^-8) = 256
    # x = 6*2^-8 -> 6 (7); 3*2^-8 -> 3 (5)
    ("subnormal-scale", _blk(6 * 2.0**-8, 3 * 2.0**-8), 1.0, 0x02, [7, 5] + [0] * 14),
    # underflowing scale: d = 2^-10 is the tie between 0 and 2^-9 -> even -> 0; then enc = FLT_MAX
    # and every nonzero x becomes ±6 (the CUDA kernel's zero-scale quirk)
    ("scale-underflow-tie", _blk(6 * 2.0**-10, -3 * 2.0**-10), 1.0, 0x00, [7, 0xF] + [0] * 14),
    # just above the tie (next bf16 after 6 is 6.03125): d > 2^-10 rounds up to 2^-9 (0x01);
    # enc = 512; x*512 = 3.015625 -> 3 (5)
    ("scale-above-tie", _blk(6.03125 * 2.0**-10), 1.0, 0x01, [5] + [0] * 15),
    # g = 0: rcp(0) = inf -> d = inf -> 448; g*448 = 0 -> enc = FLT_MAX -> ±6 for nonzero
    ("g-zero", _blk(1.0, -0.5, 0.0), 0.0, 0x7E, [7, 0xF, 0] + [0] * 13),
    # g = NaN: d NaN -> 448; enc = fminf(NaN, FLT_MAX) = FLT_MAX -> ±6 for nonzero
    ("g-nan", _blk(1.0, -2.0), NAN, 0x7E, [7, 0xF] + [0] * 14),
    # g = inf: rcp(inf) = 0 -> d = 0 -> scale 0; g*0 = NaN -> enc = FLT_MAX -> ±6 for nonzero
    ("g-inf", _blk(1.0, -2.0), INF, 0x00, [7, 0xF] + [0] * 14),
    # g = 1/2688 (amax 1 tensor), block amax 1: d = RN(RN(1*RN(1/6)) * rcp(g)) = 448.0000... ->
    # fminf 448 -> 0x7E; enc = rcp(g*448) = 6 (within an ulp) -> 1 -> 6 (7), 0.5 -> 3 (5)
    ("g-tensor-max", _blk(1.0, 0.5), 1.0 / 2688.0, 0x7E, [7, 5] + [0] * 14),
]


def _check_cases(quantize, device="cpu") -> dict:
    out = {}
    for name, blk, g, exp_s, exp_codes in CASES:
        dtype = torch.float32 if name in ("e2m1-near-ties",) else torch.bfloat16
        x = torch.tensor(blk, dtype=dtype).to(torch.bfloat16) if dtype == torch.bfloat16 else None
        if x is None:  # values that need fp32 precision: the scalar spec only (bf16 input can't hold them)
            s8, codes = scalar_spec.quantize_block([float(v) for v in blk], g)
        else:
            x16 = torch.cat([x.view(1, 16), torch.zeros(15, 16, dtype=x.dtype)])
            q, s = quantize(x16.to(device), g)
            codes = nvfp4.unpack_codes(q.cpu())[0].tolist()
            s8 = int(nvfp4.from_blocked(s.cpu().view(torch.uint8), 16, 1)[0, 0])
        ok = s8 == exp_s and codes == exp_codes
        out[f"case:{name}"] = check(ok, f"scale {s8:#04x} (want {exp_s:#04x}), codes "
                                        f"{codes if not ok else 'as expected'}")
    return out


E2M1 = Format("e2m1", 1, 0, 6.0, True)


def all_values(dtype, lo=None, hi=None) -> torch.Tensor:
    """Every finite value of a 16-bit float dtype (optionally within [lo, hi])."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    v = bits.view(dtype)
    v = v[torch.isfinite(v)]
    if lo is not None:
        v = v[(v >= lo) & (v <= hi)]
    return v


def sweep_elements(dtype, device="cpu", quantize=nvfp4.quantize) -> dict:
    """Every value in [-6, 6] at encode factor 1 (block amax 6, g 1) vs RNE onto the E2M1 grid."""
    v = all_values(dtype, -6.0, 6.0)
    n = -(-v.numel() // 15) * 15
    vals = torch.cat([v, torch.zeros(n - v.numel(), dtype=dtype)]).view(-1, 15)
    x = torch.cat([torch.full((vals.shape[0], 1), 6.0, dtype=dtype), vals], dim=1)
    pad = (-x.shape[0]) % 16
    x = torch.cat([x, torch.zeros(pad, 16, dtype=dtype)]).to(device)
    q, s = quantize(x, 1.0)
    codes = nvfp4.unpack_codes(q.cpu())[:, 1:]
    want = e2m1_encode(round_to_format(vals.float(), E2M1)).view(vals.shape)
    rows = vals.shape[0]
    scales = nvfp4.from_blocked(s.cpu().view(torch.uint8), x.shape[0], 1)[:rows, 0]
    ok_s = bool((scales == 0x38).all())
    return {f"sweep-elements-{str(dtype)[6:]}": check(
        ok_s and torch.equal(codes[:rows], want),
        f"{v.numel()} values; " + mismatch_detail(codes[:rows].contiguous(), want, "codes"))}


def sweep_scales(dtype, device="cpu", quantize=nvfp4.quantize,
                 gs=(1.0, 1 / 2688, 0.013, 3.7e-5, 77.0, 1.03125)) -> dict:
    """Every positive finite value as a block amax, for six g, vs the scalar transcription."""
    v = all_values(dtype)
    v = v[v > 0]
    out = {}
    x = v.view(-1, 1).expand(-1, 16).clone()
    pad = (-x.shape[0]) % 16
    x = torch.cat([x, torch.zeros(pad, 16, dtype=dtype)])
    for g in gs:
        _, s = quantize(x.to(device), g)
        got = nvfp4.from_blocked(s.cpu().view(torch.uint8), x.shape[0], 1)[:v.numel(), 0]
        want = _scalar_scales(v.float().tolist(), g)
        out[f"sweep-scales-{str(dtype)[6:]}-g{g:.4g}"] = check(
            torch.equal(got, want), mismatch_detail(got, want, f"{v.numel()} scales"))
    return out


def _scalar_scales(amaxes, g) -> torch.Tensor:
    return torch.tensor([scalar_spec.block_scale(a, g)[0] for a in amaxes], dtype=torch.uint8)


def mufu_stress(device="cpu", quantize=nvfp4.quantize, n_g=24, seed=0) -> dict:
    """g with 6-8 significant bits, fp16 x on a 0.25·g grid: E2M1 ties everywhere. The reference must
    match the scalar transcription; an IEEE-reciprocal model must not (shows the test bites)."""
    gen = torch.Generator().manual_seed(seed)
    mism = 0
    ieee_diff = 0
    total = 0
    corr = correction_table()
    for i in range(n_g):
        bits = int(torch.randint(6, 9, (1,), generator=gen))
        while True:  # every other g has a mantissa where MUFU != RN (the case that matters)
            mant = int(torch.randint(2 ** (bits - 1), 2**bits, (1,), generator=gen))
            m23 = (mant << (24 - bits)) & 0x7FFFFF
            if i % 2 or int(corr[m23]) != 0:
                break
        g = float(mant) * 2.0 ** (int(torch.randint(-20, -6, (1,), generator=gen)) - bits)
        ties = torch.tensor([1, 3, 5, 7, 10, 14, 20, 24], dtype=torch.float32)
        k = ties[torch.randint(0, 8, (32, 64), generator=gen)]
        k = k * torch.where(torch.rand(32, 64, generator=gen) < 0.5, -1.0, 1.0)
        k.view(-1, 16)[:, 0] = 24.0  # block amax 6g -> block scale 1.0
        x = (k * 0.25 * g).to(torch.float16)  # exact: <= 11 significant bits
        q, s = quantize(x.to(device), g)
        q = q.cpu()
        want = _scalar_quantize(x, g)
        mism += int((q != want).sum())
        ieee_diff += int((q != _ieee_quantize(x, g)).sum())
        total += q.numel()
    return {"mufu-stress": check(mism == 0, f"{mism} of {total} packed bytes differ from the scalar "
                                            f"transcription"),
            "mufu-stress-bites": check(ieee_diff > 0, f"an IEEE-reciprocal model differs in "
                                                      f"{ieee_diff} bytes (must be > 0)")}


def _scalar_quantize(x: torch.Tensor, g: float) -> torch.Tensor:
    rows = []
    for r in x.float().view(-1, 16).tolist():
        rows.append(scalar_spec.quantize_block(r, g)[1])
    codes = torch.tensor(rows, dtype=torch.uint8).view(x.shape)
    return nvfp4.pack_codes(codes)


def _ieee_quantize(x: torch.Tensor, g: float) -> torch.Tensor:
    orig = nvfp4.rcp_approx
    try:
        nvfp4.rcp_approx = lambda t: 1.0 / torch.as_tensor(t, dtype=torch.float32)
        q, _ = nvfp4.quantize(x, g)
    finally:
        nvfp4.rcp_approx = orig
    return q


def run(quick: bool = False, device: str = "cpu", quantize=None) -> RungResult:
    # the cases feed NaN and inf g on purpose: the kernel reads g from device memory and cannot
    # refuse it, so the reference models what it computes (numerics.nvfp4 nonfinite_g)
    quantize = quantize or functools.partial(nvfp4.quantize, nonfinite_g=True)
    checks = {}
    checks.update(_check_cases(quantize, device))
    for dt in (torch.bfloat16, torch.float16):
        checks.update(sweep_elements(dt, device, quantize))
        checks.update(sweep_scales(dt, device, quantize,
                                   gs=(1.0, 1 / 2688) if quick else
                                   (1.0, 1 / 2688, 0.013, 3.7e-5, 77.0, 1.03125)))
    checks.update(mufu_stress(device, quantize, n_g=6 if quick else 24))
    return RungResult.from_checks(1, NAME, checks)
