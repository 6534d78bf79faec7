"""Device arithmetic shared by the fast loop's attention kernel (kernels/depth/attention.py) and
the depth frame's attention tasks (kernels/depth/frame_attention.py): RoPE's rounded value,
the butterfly reduce-scatter of a lane's partial dot products, and the softmax over the 16
cache slots held one a lane. Each is the loop's arithmetic, in the loop's order; the loop's
kernel calls these and compiles to the PTX it did before they were factored out.

Plain helpers, not ``cute.jit`` functions: they hold no dynamic control flow, and their Python
loops unroll as the caller's kernel traces them.
"""
from __future__ import annotations

from device.rounding import round_bf16
from device.runtime import cute_modules

cutlass, cute = cute_modules()
from cutlass import Float32, Int32  # noqa: E402,F401


def rope_value(x: Float32, partner: Float32, c: Float32, s: Float32) -> Float32:
    """``bf16(bf16(x·cos) + bf16(rotate_half(x)·sin))``, the reference's three roundings;
    ``partner`` is rotate_half's value (dimension d ^ D/2, negated in the first half)."""
    return round_bf16(round_bf16(x * c) + round_bf16(partner * s))


def reduce_scatter(part: list, lane: Int32, lanes: int) -> list:
    """Sum ``part`` (n values a lane, n a multiple of ``lanes``, a power of 2) over the
    ``lanes`` lanes of an aligned group by a butterfly reduce-scatter: log2(lanes) steps, each
    halving the list (send one half to the partner lane ``lane ^ o``, add the other half it
    sends), n - n / lanes shuffles in all. Lane i of the group ends with the sums of values
    i·m .. i·m + m - 1 (m = n / lanes), each a fixed tree over the lanes (the same bits in any
    run)."""
    steps = lanes.bit_length() - 1
    for step in range(steps):
        o = lanes >> (step + 1)
        half = len(part) // 2
        upper = (lane & o) != 0
        nxt = []
        for i in range(half):
            send = cutlass.select_(upper, part[i], part[i + half])
            keep = cutlass.select_(upper, part[i + half], part[i])
            nxt.append(keep + cute.arch.shuffle_sync_bfly(send, offset=o))
        part = nxt
    return part


def slot_softmax(dot: Float32, live, scale: float, divide=None) -> Float32:
    """p of the slot this lane holds, for 16 lanes (an aligned half warp) holding the 16 slots
    of one head: scores ``dot · scale`` (``live``: slot <= pos, else masked), their max and
    the sum of ``exp(score - max)`` by xor shuffles 8, 4, 2, 1 (every lane gets the same
    bits), p rounded to bf16 as the reference does. ``divide``: e / den (None: IEEE
    division)."""
    sc = cutlass.select_(live, dot * Float32(scale), Float32(-3.0e38))
    best = sc
    for k in range(4):
        best = cute.arch.fmax(best, cute.arch.shuffle_sync_bfly(best, offset=8 >> k))
    e = cutlass.select_(live, cute.math.exp(sc - best), Float32(0.0))
    den = e
    for k in range(4):
        den = den + cute.arch.shuffle_sync_bfly(den, offset=8 >> k)
    return round_bf16(e / den if divide is None else divide(e, den))
