"""The synthetic H3 workload: reproducible from the seed, H3's shapes, heavy-tailed activation
channels, and a stable trajectory checksum."""
import hashlib

import pytest
import torch

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
    with pytest.raises(BackendUnavailable, match="issue #4"):
        H3Model(TINY, backend="p1")
    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailable, match="p0 backend needs a CUDA GPU"):
            H3Model(TINY, backend="p0")


def test_bad_model_arguments_refused():
    with pytest.raises(TypeError, match="cfg must be an H3Config"):
        H3Model({"hidden": 128})
    with pytest.raises(TypeError, match="seed must be an int"):
        H3Model(TINY, seed=1.5)
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        H3Model(TINY, device="tpu")
