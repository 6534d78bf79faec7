"""The stream-K schedule (device.tiles.StreamKSchedule) on the host: every tile's k-blocks
covered once, by consecutive CTAs whose segment indices run 0, 1, ... in K order; every CTA's
share within one k-block of every other's; the workspace depth bounds every tile's segments.
The kernel walks the same arithmetic (device.tiles._for_each_stream_k_unit)."""
from hypothesis import given, settings
from hypothesis import strategies as st

from device.tiles import max_stream_k_segments, stream_k_units


def _check(tiles, k_tiles, ctas):
    per_cta = stream_k_units(tiles, k_tiles, ctas)
    assert len(per_cta) == min(ctas, tiles * k_tiles)
    shares = [sum(k1 - k0 for *_, k0, k1 in units) for units in per_cta]
    assert min(shares) >= 1 and max(shares) - min(shares) <= 1
    assert sum(shares) == tiles * k_tiles
    by_tile = {}
    for cta, units in enumerate(per_cta):
        for t, seg, segs, k0, k1 in units:
            assert 0 <= k0 < k1 <= k_tiles
            by_tile.setdefault(t, []).append((seg, segs, k0, k1, cta))
    assert sorted(by_tile) == list(range(tiles))
    bound = max_stream_k_segments(tiles, k_tiles, ctas)
    for t, parts in by_tile.items():
        parts.sort(key=lambda p: p[2])
        segs = {p[1] for p in parts}
        assert segs == {len(parts)} and len(parts) <= bound, (t, parts)
        assert [p[0] for p in parts] == list(range(len(parts)))  # segment = order in K
        assert [p[4] for p in parts] == list(range(parts[0][4], parts[0][4] + len(parts)))
        assert parts[0][2] == 0 and parts[-1][3] == k_tiles
        assert all(a[3] == b[2] for a, b in zip(parts, parts[1:]))


def test_stream_k_at_the_dit_shapes():
    """M = 128 on 132 SMs: qkv 168 tiles, out and fc2 42, fc1 112, 7168x5376 56."""
    for tiles, k_tiles in ((168, 84), (42, 84), (112, 84), (42, 224), (56, 84)):
        _check(tiles, k_tiles, 132)
    assert max(sum(k1 - k0 for *_, k0, k1 in u) for u in stream_k_units(168, 84, 132)) == 107


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 300), st.integers(1, 300), st.integers(1, 264))
def test_stream_k_covers_every_k_block_once(tiles, k_tiles, ctas):
    _check(tiles, k_tiles, ctas)
