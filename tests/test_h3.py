"""The synthetic H3 workload: reproducible from the seed, H3's shapes, heavy-tailed activation
channels, and a stable trajectory checksum."""
import hashlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from models.h3 import (FULL, QUICK, ROLES, H3Config, H3Model, block_vectors, checksum,
                       initial_latent, weight)
from models.nvfp4_linear import BackendUnavailable

TINY = H3Config(blocks=2, hidden=128, mlp=256, head_dim=64, video_tokens=160, audio_tokens=32,
                steps=2)


def test_full_config_is_h3():
    assert FULL.tokens == 37_810 and FULL.blocks == 50 and FULL.steps == 12
    assert FULL.shapes() == {"qkv": (21504, 5376), "out": (5376, 5376), "fc1": (14336, 5376),
                             "fc2": (5376, 14336)}


@pytest.mark.parametrize("cfg", [FULL, QUICK, TINY])
def test_shapes_fit_the_kernels(cfg):
    for N, K in cfg.shapes().values():
        assert K % 64 == 0 and N % 128 == 0, (N, K)
    assert cfg.hidden % cfg.head_dim == 0


def test_weights_reproducible_from_the_seed():
    for role in ROLES:
        w = weight(TINY, 7, 1, role)
        assert w.dtype == torch.bfloat16 and tuple(w.shape) == TINY.shapes()[role]
        assert torch.equal(w, weight(TINY, 7, 1, role))
        assert not torch.equal(w, weight(TINY, 8, 1, role))
        assert not torch.equal(w, weight(TINY, 7, 0, role))
    assert torch.equal(initial_latent(TINY, 7), initial_latent(TINY, 7))
    assert not torch.equal(initial_latent(TINY, 7), initial_latent(TINY, 8))
    v = block_vectors(TINY, 7, 0)
    assert all(torch.equal(v[k], block_vectors(TINY, 7, 0)[k]) for k in v)


def test_weight_scale_is_realistic():
    w = weight(QUICK, 0, 0, "fc1").double()
    row_rms = w.pow(2).mean(1).sqrt() * QUICK.hidden**0.5  # ~1 a row before its gain
    assert 0.6 < float(row_rms.median()) < 1.6
    assert float(row_rms.max()) > 6 * float(row_rms.median())  # the outlier rows


def _channel_ratio(x):
    rms = x.double().pow(2).mean(0).sqrt()
    return float(rms.max() / rms.median())


def test_heavy_tailed_activation_channels():
    model = H3Model(QUICK, seed=0)
    seen = {}

    def record(block, role, lin):
        def rec(x, rows=None, **epilogue):
            seen[role] = x
            return lin(x, rows=rows, **epilogue)
        return rec

    latent = initial_latent(QUICK, 0)
    assert _channel_ratio(latent) > 10
    model.derived(wrap=record).block(0, latent)
    assert _channel_ratio(seen["qkv"]) > 8
    assert _channel_ratio(seen["fc2"]) > 8
    x = seen["fc2"].double()
    kurtosis = float(((x - x.mean()) ** 4).mean() / x.var() ** 2)
    assert kurtosis > 6  # a normal distribution has 3


def test_block_and_trajectory_are_deterministic():
    model = H3Model(TINY, seed=0)
    x = initial_latent(TINY, 0)
    y = model.block(0, x)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape and bool(torch.isfinite(y).all())
    assert not torch.equal(y, x)
    assert torch.equal(y, H3Model(TINY, seed=0, cache=False).block(0, x))
    a = checksum(model.trajectory())
    b = checksum(H3Model(TINY, seed=0).trajectory())
    assert a == b and a["finite"] and a["shape"] == [TINY.tokens, TINY.hidden]
    assert checksum(H3Model(TINY, seed=1).trajectory())["sha256"] != a["sha256"]


def test_checksum_is_sha256_of_the_bf16_bytes():
    x = initial_latent(TINY, 3)
    c = checksum(x)
    assert c["sha256"] == hashlib.sha256(x.view(torch.uint8).numpy().tobytes()).hexdigest()
    y = x.clone()
    y.view(torch.int16)[5, 6] ^= 1  # one bit of one element
    assert checksum(y)["sha256"] != c["sha256"]
    assert c["rms"] == pytest.approx(float(x.double().pow(2).mean().sqrt()))


def test_cache_off_keeps_no_weights():
    model = H3Model(TINY, seed=0, cache=False)
    model.block(0, initial_latent(TINY, 0))
    assert model._linears == {}


def test_unavailable_backends_refused():
    if not torch.cuda.is_available():
        for backend in ("p0", "p1", "p2"):
            with pytest.raises(BackendUnavailable, match=f"{backend} backend needs a CUDA GPU"):
                H3Model(TINY, backend=backend)


def test_bad_model_arguments_refused():
    with pytest.raises(TypeError, match="cfg must be an H3Config"):
        H3Model({"hidden": 128})
    with pytest.raises(TypeError, match="seed must be an int"):
        H3Model(TINY, seed=1.5)
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        H3Model(TINY, device="tpu")


# --- argument checks: each raised before any work, naming the argument ------------------------
FIELDS = ("blocks", "hidden", "mlp", "head_dim", "video_tokens", "audio_tokens", "steps")


@given(name=st.sampled_from(FIELDS),
       bad=st.sampled_from(["128", 128.0, 1.5, True, False, None, [128]]))
def test_config_refuses_a_field_that_is_not_an_int(name, bad):
    with pytest.raises(TypeError, match=rf"H3Config\.{name} = .*expected an int"):
        H3Config(**{**TINY.__dict__, name: bad})


@given(name=st.sampled_from(FIELDS), bad=st.integers(-2**70, 0))
def test_config_refuses_a_field_below_its_least_value(name, bad):
    if name in ("video_tokens", "audio_tokens"):
        bad -= 1  # 0 tokens of one kind is a config (the other kind is there)
    with pytest.raises(ValueError, match=rf"H3Config\.{name} = {bad}; expected an int >="):
        H3Config(**{**TINY.__dict__, name: bad})


def test_config_refuses_widths_the_model_cannot_run():
    with pytest.raises(ValueError, match="hidden = 160 is not a multiple of head_dim = 128"):
        H3Config(hidden=160)  # ended in a reshape error deep in the block
    with pytest.raises(ValueError, match=r"hidden = -128; expected an int >= 32"):
        H3Config(hidden=-128)  # shapes() returned negative shapes
    with pytest.raises(ValueError, match="mlp = 1000; expected a multiple of 32"):
        H3Config(mlp=1000)
    with pytest.raises(ValueError, match="hidden = 144; expected a multiple of 32"):
        H3Config(hidden=144, head_dim=16)
    with pytest.raises(ValueError, match="no tokens"):
        H3Config(video_tokens=0, audio_tokens=0)


@given(blocks=st.integers(1, 60), heads=st.integers(1, 8), head_dim=st.sampled_from([32, 64, 128]),
       mlp=st.integers(1, 500), video=st.integers(0, 10**5), audio=st.integers(0, 10**5),
       steps=st.integers(1, 50))
def test_valid_configs_have_positive_shapes(blocks, heads, head_dim, mlp, video, audio, steps):
    if video + audio == 0:
        audio = 1
    cfg = H3Config(blocks, heads * head_dim, 32 * mlp, head_dim, video, audio, steps)
    assert cfg.heads == heads and cfg.tokens == video + audio
    assert all(n > 0 and k > 0 and k % 32 == 0 and n % 16 == 0 for n, k in cfg.shapes().values())


ONE_BLOCK = H3Config(**{**TINY.__dict__, "blocks": 1})


@pytest.mark.parametrize("index, error, match", [
    (5, ValueError, r"block = 5; this config's blocks are 0\.\.0"),
    (1, ValueError, r"block = 1; this config's blocks are 0\.\.0"),
    (-1, ValueError, r"block = -1; this config's blocks are 0\.\.0"),
    ("0", TypeError, r"block must be an int in 0\.\.0, got '0'"),
    (1.0, TypeError, r"block must be an int in 0\.\.0, got 1\.0"),
    (True, TypeError, r"block must be an int in 0\.\.0, got True"),
    (None, TypeError, "block must be an int")])
def test_block_index_refused_before_any_weight_is_made(index, error, match):
    model = H3Model(ONE_BLOCK)
    x = initial_latent(ONE_BLOCK, 0)
    for call in (lambda: model.block(index, x), lambda: model.linears(index),
                 lambda: model.vectors(index), lambda: weight(ONE_BLOCK, 0, index, "qkv"),
                 lambda: block_vectors(ONE_BLOCK, 0, index)):
        with pytest.raises(error, match=match):
            call()
    assert model._linears == {} and model._vectors == {}


def test_weight_refuses_an_unknown_role():
    for role in ("bogus", 123, None):
        with pytest.raises(ValueError, match=r"role must be one of \('qkv', 'out', 'fc1', 'fc2'\)"):
            weight(TINY, 0, 0, role)


@pytest.mark.parametrize("steps, error, match", [
    (-1, ValueError, r"steps = -1; expected 1\.\.2"),  # returned the initial noise
    (0, ValueError, r"steps = 0; expected 1\.\.2"),
    (3, ValueError, r"steps = 3; expected 1\.\.2"),  # ran past sigma 0
    (1.5, TypeError, r"steps must be an int in 1\.\.2, got 1\.5"),
    (True, TypeError, r"steps must be an int in 1\.\.2, got True"),
    ("2", TypeError, "steps must be an int")])
def test_trajectory_steps_refused(steps, error, match):
    model = H3Model(TINY, cache=False, wrap=_no_linear_may_run)
    with pytest.raises(error, match=match):
        model.trajectory(steps=steps)


def _no_linear_may_run(block, role, lin):
    raise AssertionError("a refused call must not reach a linear")


@pytest.mark.parametrize("make, error, match", [
    (lambda x: x[0], ValueError, r"latent has shape \(128,\); expected \[tokens, hidden\] = "
                                 r"\[192, 128\]"),
    (lambda x: x[:, :64], ValueError, r"latent has shape \(192, 64\)"),
    (lambda x: x[:100], ValueError, r"latent has shape \(100, 128\)"),
    (lambda x: x[None], ValueError, r"latent has shape \(1, 192, 128\)"),
    (lambda x: x.float(), TypeError, "latent has dtype torch.float32; expected torch.bfloat16"),
    (lambda x: x.tolist(), TypeError, "latent must be a torch.Tensor, got list"),
    (lambda x: x.to("meta"), ValueError, "latent is on meta; the model is on cpu")])
def test_a_wrong_latent_is_refused_before_any_work(make, error, match):
    model = H3Model(TINY, cache=False, wrap=_no_linear_may_run)
    bad = make(initial_latent(TINY, 0))
    for call in (lambda: model.trajectory(latent=bad), lambda: model.denoiser_step(bad, 0),
                 lambda: model.sampler_update(bad, bad, 0)):
        with pytest.raises(error, match=match):
            call()
    with pytest.raises(error, match=match.replace("latent", "x", 1)):
        model.block(0, bad)


def test_step_arguments_outside_the_schedule_refused():
    model = H3Model(TINY, cache=False, wrap=_no_linear_may_run)
    x = initial_latent(TINY, 0)
    assert model.sigma(0) == 1.0 and model.sigma(TINY.steps) == 0.0
    with pytest.raises(ValueError, match=r"step = 3; expected 0\.\.2"):
        model.sigma(3)
    with pytest.raises(ValueError, match=r"step = 2; expected 0\.\.1"):
        model.denoiser_step(x, 2)  # the last step's sigma_{t+1} would be below 0
    with pytest.raises(ValueError, match=r"step = -1; expected 0\.\.1"):
        model.sampler_update(x, x, -1)
    with pytest.raises(TypeError, match="step must be an int"):
        model.denoiser_step(x, 0.0)
    with pytest.raises(TypeError, match="on_step must be a callable or None"):
        model.trajectory(on_step="print")
    with pytest.raises(TypeError, match="on_block must be a callable or None"):
        model.denoiser_step(x, 0, on_block=1)


def test_model_flags_refused():
    with pytest.raises(TypeError, match="cache must be True or False"):
        H3Model(TINY, cache=1)
    with pytest.raises(TypeError, match="wrap must be a callable or None"):
        H3Model(TINY, wrap="record")
    with pytest.raises(TypeError, match="seed must be an int"):
        H3Model(TINY, seed=True)
