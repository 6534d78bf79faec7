"""kernels/depth/draw.py: one depth-loop draw per row (temperature, top-k, Philox Gumbel-max) and
the gathers the next position needs. Its compiled code; on the H200 its codes against
models.sampler on the same logits and its gathers bit for bit."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models.sampler import Sampler, SamplerSettings, draw, filtered_scores
from tests.depth_helpers import poison, randn_bf16


# ---- compile tests (CPU) --------------------------------------------------------------------
@pytest.mark.compile
def test_sampler_compiles_without_calls():
    """Philox and the fp64 logs inlined (libdevice's polynomial, the one torch's CUDA log uses),
    no approximations, no spills."""
    from kernels.depth.draw import DepthSampler, compile_args
    from workbench.compile import compile_report

    r = compile_report(DepthSampler(8, 2048, 1024, 2048, "sample"), *compile_args())
    assert r.spill_bytes == 0 and r.ptx.count("call") == 0
    assert "atom.shared" in r.ptx and "mul.hi.u32" in r.ptx
    assert "lg2.approx" not in r.ptx and "fma.rn.f64" in r.ptx
    assert "rsqrt" not in r.ptx and "%globaltimer" not in r.ptx


@pytest.mark.compile
@pytest.mark.parametrize("noise", ["early", "compact"])
def test_sampler_noise_and_trace_compile(noise):
    """``noise``: "compact" moves the survivors to shared memory by one ballot and one leader's
    atomic per element slot, then draws one a thread in a loop over them; "early" draws once
    per element slot, unrolled, before the dependency wait; ``trace``: a %globaltimer read per
    DRAW_TRACE_POINTS entry."""
    from kernels.depth.draw import DRAW_TRACE_POINTS, DepthSampler, compile_args
    from workbench.compile import compile_report

    r = compile_report(DepthSampler(8, 2048, 1024, 2048, "sample", trace=True, noise=noise),
                       *compile_args())
    compact = noise == "compact"
    assert r.spill_bytes == 0 and r.ptx.count("call") == 0
    # Philox4x32-10 inlined once (compact) or once per element slot: up to 20 mul.hi each (the
    # compiler folds or drops a few: only two of the four words are used)
    muls = r.ptx.count("mul.hi.u32")
    assert 16 <= muls <= 20 if compact else muls >= 8 * 16
    assert r.ptx.count("vote.sync.ballot") == (8 if compact else 0)
    assert r.ptx.count("%globaltimer") == len(DRAW_TRACE_POINTS)
    if noise == "early":  # every Philox product before the wait
        wait = r.ptx.index("griddepcontrol.wait")
        assert r.ptx.count("mul.hi.u32", 0, wait) == muls


@pytest.mark.compile
def test_sampler_qkv_gather_compiles_to_16_byte_copies():
    """``qkv_width``: the next position's QKV row gathered from the per-code table in 16-byte
    runs, two a thread at 4096 columns, after the draw and without spills."""
    from kernels.depth.draw import DepthSampler, compile_args
    from workbench.compile import compile_report

    plain = compile_report(DepthSampler(64, 2048, 1024, 2048, "greedy"), *compile_args())
    r = compile_report(DepthSampler(64, 2048, 1024, 2048, "greedy", qkv_width=4096),
                       *compile_args())
    assert r.spill_bytes == 0
    v4 = "ld.global.v4.b32", "st.global.v4.b32"
    assert [r.ptx.count(op) - plain.ptx.count(op) for op in v4] == [2, 2]
    with pytest.raises(ValueError, match="QKV"):
        DepthSampler(64, 2048, 1024, 2048, "greedy", qkv_width=1000)


@pytest.mark.compile
def test_sampler_talker_sum_compiles_to_one_rounding_a_pair():
    """``talker_sum``: the partial's two 16-byte loads and the result's one store a thread,
    one bf16x2 rounding a pair of columns, after the gather and without spills."""
    from kernels.depth.draw import DepthSampler, compile_args
    from workbench.compile import compile_report

    plain = compile_report(DepthSampler(64, 2048, 1024, 2048, "sample"), *compile_args())
    r = compile_report(DepthSampler(64, 2048, 1024, 2048, "sample", talker_sum=True),
                       *compile_args())
    assert r.spill_bytes == 0
    extra = [r.ptx.count(op) - plain.ptx.count(op)
             for op in ("ld.global.v4.b32", "st.global.v4.b32", "cvt.rn.bf16x2.f32")]
    assert extra == [2, 1, 4], extra


@pytest.mark.compile
@pytest.mark.parametrize("mode", ["sample", "forced"])
def test_sampler_loads_leave_in_one_batch(mode):
    """The row's parameters (and the offset ``advance`` adds to) are read before the
    dependency wait; after it the row's logits all leave before the first division, and the
    gathers (table, Talker embedding, talker-sum partial, QKV rows) before the first of their
    stores, so each phase waits for memory once (v13a: the division's slow-path branch and the
    stores' possible aliasing had kept every load behind the previous one's use)."""
    import re

    from kernels.depth.draw import DepthSampler, compile_args
    from workbench.compile import compile_report

    r = compile_report(DepthSampler(64, 2048, 1024, 2048, mode, talker_sum=True,
                                    qkv_width=4096, advance=15), *compile_args())
    assert r.spill_bytes == 0
    ptx = r.ptx
    wait = ptx.index("griddepcontrol.wait")
    params = 4 if mode == "sample" else 1  # T, k, seed, offset / the offset alone
    assert len(re.findall(r"ld\.global\.b(32|64)", ptx[:wait])) == params
    after = ptx[wait:]
    if mode == "sample":
        loads = [m.start() for m in re.finditer(r"ld\.global\.b32", after)]
        assert len(loads) >= 8 and max(loads[:8]) < after.index("div.rn.f32")
    gathers = [m.start() for m in re.finditer(r"ld\.global\.v4", after)]
    assert len(gathers) == 1 + 1 + 2 + 2  # table, embedding, partial (2), QKV (2)
    assert max(gathers) < after.index("st.global.v4")
    # the offset advance: one 64-bit store of the value read before the wait
    assert after.count("st.global.b64") == 2  # the code and the offset


def test_sampler_refuses_an_unknown_noise_mode():
    pytest.importorskip("cutlass")
    from kernels.depth.draw import NOISE, DepthSampler

    assert NOISE == ("early", "compact")
    with pytest.raises(ValueError, match="noise"):
        DepthSampler(8, 2048, 1024, 2048, "sample", noise="inline")


# ---- GPU tests -------------------------------------------------------------------------------
def _draw_case(M, V, seed, g):
    logits = (torch.randn(M, V, device="cuda", generator=g) * 3).round(decimals=1)  # ties
    temps = [0.0, 0.7, 1.3, 0.9]
    ks = [0, 1, 50, V + 5, 7]
    settings_ = [SamplerSettings(temperature=temps[(seed + i) % 4], top_k=ks[(seed + i) % 5])
                 for i in range(M)]
    smp = Sampler(M, settings_, seeds=[(seed + i) * 0x1_0000_0001 % 2**62 for i in range(M)],
                  device="cuda")
    smp.offset += (seed % 5) * 2**32 + 11
    return logits, smp


def _check_draws_and_gathers(seed, M, d, noise):
    """The codes of models.sampler on the same logits (ties at the k-th value, k from 1 to
    past V, greedy rows) and the gathered rows; then greedy, forced, the talker sum's end and
    the offset advance."""
    from functools import partial

    from kernels.depth.draw import depth_draw as plain_draw

    V, hidden, talker = 2048, 1024, 2048
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits, smp = _draw_case(M, V, seed, g)
    table, embeds = randn_bf16(V, hidden, g=g), randn_bf16(V, talker, g=g)
    depth_draw = partial(plain_draw, noise=noise)
    ref = draw(filtered_scores(logits, smp.temperature, smp.top_k), smp.temperature, smp.seed,
               smp.offset + d)
    big = torch.zeros(M, 15, V, device="cuda")
    big[:, d] = logits  # strided rows, as the loop's logits buffer
    codes = torch.full((M, 15), -1, dtype=torch.int64, device="cuda")
    x_next, used = poison(M, hidden), poison(M, 16, talker)
    depth_draw(big[:, d], codes[:, d], table, embeds, x_next, used[:, d + 1 if d < 15 else 0],
               d, mode="sample", temperature=smp.temperature, top_k=smp.top_k, seed=smp.seed,
               offset=smp.offset)
    assert torch.equal(codes[:, d], ref)
    assert torch.equal(x_next, table[ref]) and torch.equal(used[:, d + 1], embeds[ref])
    # greedy and teacher-forced modes
    depth_draw(big[:, d], codes[:, d], table, embeds, x_next, used[:, d + 1], d, mode="greedy")
    assert torch.equal(codes[:, d], logits.argmax(-1))
    forced = torch.randint(0, V, (M, 15), device="cuda", generator=g)
    depth_draw(big[:, d], codes[:, d], table, embeds, x_next, used[:, d + 1], d, mode="forced",
               codes_in=forced[:, d])
    assert torch.equal(codes[:, d], forced[:, d]) and torch.equal(x_next, table[forced[:, d]])
    # the frame's last draw ends the talker sum: bf16(fp32 partial + the gathered row)
    part = torch.randn(M, talker, device="cuda", generator=g) * 4
    total = poison(M, talker)
    depth_draw(big[:, d], codes[:, d], table, embeds, x_next, used[:, d + 1], d, mode="forced",
               codes_in=forced[:, d], sum_in=part, sum_out=total)
    assert torch.equal(total, torch.add(part, embeds[forced[:, d]], out=poison(M, talker)))
    # the frame's last draw also advances the offsets, after its own reads of them
    before = smp.offset.clone()
    depth_draw(big[:, d], codes[:, d], table, embeds, x_next, used[:, d + 1], d, mode="sample",
               temperature=smp.temperature, top_k=smp.top_k, seed=smp.seed, offset=smp.offset,
               advance=15)
    assert torch.equal(codes[:, d], ref) and torch.equal(smp.offset, before + 15)
    depth_draw(big[:, d], codes[:, d], table, embeds, x_next, used[:, d + 1], d, mode="forced",
               codes_in=forced[:, d], offset=smp.offset, advance=2)
    assert torch.equal(smp.offset, before + 17)


@pytest.mark.gpu
@pytest.mark.fast
def test_depth_draw_equals_reference_sampler_on_the_loops_default():
    """_check_draws_and_gathers once, as the loop draws above 8 rows: early noise."""
    _check_draws_and_gathers(seed=1, M=64, d=5, noise="early")


@pytest.mark.gpu
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**20), M=st.sampled_from([1, 3, 8, 64]), d=st.integers(0, 14),
       noise=st.sampled_from(["early", "compact"]))
def test_depth_draw_equals_reference_sampler_and_gathers(seed, M, d, noise):
    """_check_draws_and_gathers over rows, draws and both noise places."""
    _check_draws_and_gathers(seed, M, d, noise)


@pytest.mark.gpu
@pytest.mark.parametrize("noise", ["early", "compact"])
def test_depth_draw_follows_the_samplers_nan_rule(noise):
    """NaN logits (either sign) are never drawn and a row without a candidate (all NaN, all
    -inf, or NaN wherever top-k would look) draws V, as models.sampler.draw does; its gathers
    read the last table row (memory-safe). Greedy mode the same."""
    from kernels.depth.draw import depth_draw

    M, V, d = 8, 2048, 2
    g = torch.Generator(device="cuda").manual_seed(23)
    logits, smp = _draw_case(M, V, 3, g)
    logits[0, ::3] = float("nan")  # NaN among finite logits
    logits[1, :7] = -float("nan")
    logits[2] = float("nan")  # nothing to draw
    logits[3] = -float("inf")
    logits[4, :] = float("nan")
    logits[4, 100] = 1.0  # one candidate
    table, embeds = randn_bf16(V, 1024, g=g), randn_bf16(V, 2048, g=g)
    for mode in ("sample", "greedy"):
        kw = dict(temperature=smp.temperature, top_k=smp.top_k, seed=smp.seed,
                  offset=smp.offset) if mode == "sample" else {}
        T = smp.temperature if mode == "sample" else torch.zeros_like(smp.temperature)
        k = smp.top_k if mode == "sample" else torch.zeros_like(smp.top_k)
        ref = draw(filtered_scores(logits, T, k), T, smp.seed, smp.offset + d)
        codes = torch.full((M,), -1, dtype=torch.int64, device="cuda")
        x_next, used = poison(M, 1024), poison(M, 2048)
        depth_draw(logits, codes, table, embeds, x_next, used, d, mode=mode, noise=noise, **kw)
        assert torch.equal(codes, ref), (mode, codes.tolist(), ref.tolist())
        assert (codes[2:4] == V).all() and codes[4] == 100
        rows = codes.clamp(max=V - 1)
        assert torch.equal(x_next, table[rows]) and torch.equal(used, embeds[rows])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["sample", "greedy", "forced"])
def test_depth_draw_trace_stamps_every_row_in_order(mode):
    """``trace``: each row's CTA stamps DRAW_TRACE_POINTS, non-decreasing, and draws the same
    code as the untraced build."""
    from kernels.depth.draw import DRAW_TRACE_POINTS, depth_draw

    M, V, d = 64, 2048, 3
    g = torch.Generator(device="cuda").manual_seed(17)
    logits, smp = _draw_case(M, V, 5, g)
    table, embeds = randn_bf16(V, 1024, g=g), randn_bf16(V, 2048, g=g)
    forced = torch.randint(0, V, (M,), device="cuda", generator=g)
    kw = dict(mode=mode, codes_in=forced) if mode != "sample" else dict(
        mode=mode, temperature=smp.temperature, top_k=smp.top_k, seed=smp.seed,
        offset=smp.offset)
    codes = []
    for trace in (None, torch.full((M, len(DRAW_TRACE_POINTS)), -1, dtype=torch.int64,
                                   device="cuda")):
        c = torch.full((M,), -1, dtype=torch.int64, device="cuda")
        depth_draw(logits, c, table, embeds, poison(M, 1024), poison(M, 2048), d, trace=trace,
                   **kw)
        codes.append(c)
    assert torch.equal(codes[0], codes[1])
    assert (trace > 0).all() and (trace.diff(dim=1) >= 0).all()
