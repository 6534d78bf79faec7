"""The on-disk cache of H3's packed weights (models.weight_cache): the same bits with and
without it, a key that changes with everything deciding the bytes, atomic files, a bad file
packed again, never under results/; and derived models that pack nothing themselves."""
import dataclasses

import pytest
import torch

from models import weight_cache as W
from models.h3 import QUICK, ROLES, H3Config, H3Model, initial_latent, weight
from models.nvfp4_linear import Nvfp4Linear
from workbench import WorkbenchError
from workbench import results as R

TINY = H3Config(blocks=2, hidden=128, mlp=256, head_dim=64, video_tokens=160, audio_tokens=32,
                steps=2)


def _same_linear(a: Nvfp4Linear, b: Nvfp4Linear) -> bool:
    return (a.backend == b.backend and a.role == b.role and (a.N, a.K) == (b.N, b.K)
            and a.g_w == b.g_w and torch.equal(a.w_q, b.w_q)
            and torch.equal(a.w_s.view(torch.uint8), b.w_s.view(torch.uint8)))


def test_quick_config_same_bits_with_and_without_the_cache(tmp_path):
    """QUICK, reference backend on the CPU: the packed weights and a whole denoiser step
    are bit for bit the uncached model's, whether the cache packed them or loaded them."""
    plain = H3Model(QUICK, seed=0)
    first = H3Model(QUICK, seed=0, weight_cache=W.WeightCache(tmp_path / "w"))
    second_cache = W.WeightCache(tmp_path / "w")
    second = H3Model(QUICK, seed=0, weight_cache=second_cache)
    for b in range(QUICK.blocks):
        for r in ROLES:
            p = plain.linears(b)[r]
            assert _same_linear(first.linears(b)[r], p) and _same_linear(second.linears(b)[r], p)
    assert (first.weight_cache.packed, first.weight_cache.loaded) == (4 * QUICK.blocks, 0)
    assert (second_cache.packed, second_cache.loaded) == (0, 4 * QUICK.blocks)
    files = sorted(p.name for p in (tmp_path / "w").iterdir())
    assert len(files) == 4 * QUICK.blocks and not [f for f in files if f.endswith(".tmp")]
    latent = initial_latent(QUICK, 0)
    want = plain.denoiser_step(latent, 0)
    got = H3Model(QUICK, seed=0, weight_cache=W.WeightCache(tmp_path / "w")).denoiser_step(
        latent, 0)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_key_names_everything_that_decides_the_bytes(tmp_path, monkeypatch):
    cache = W.WeightCache(tmp_path)
    base = cache.key(TINY, 0, 1, "fc1", "cpu")
    paths = {cache.path(base)}
    for other in (cache.key(TINY, 1, 1, "fc1", "cpu"), cache.key(TINY, 0, 0, "fc1", "cpu"),
                  cache.key(TINY, 0, 1, "fc2", "cpu"), cache.key(TINY, 0, 1, "fc1", "cuda"),
                  cache.key(dataclasses.replace(TINY, mlp=512), 0, 1, "fc1", "cpu"),
                  cache.key(dataclasses.replace(TINY, steps=3), 0, 1, "fc1", "cpu"),
                  {**base, "format": W.FORMAT + 1}, {**base, "torch": "0.0"},
                  {**base, "weight_dtype": "float16"}):
        paths.add(cache.path(other))
    assert len(paths) == 10
    monkeypatch.setattr(W, "_source_digest", "an edited quantizer")
    assert cache.path(cache.key(TINY, 0, 1, "fc1", "cpu")) not in paths
    assert all((R.REPO_ROOT / f).is_file() for f in W._SOURCES)  # what the digest reads


def _make(block, role):
    return lambda: Nvfp4Linear(weight(TINY, 0, block, role), role=role)


def test_a_bad_or_foreign_file_is_packed_again_and_replaced(tmp_path, capsys):
    cache = W.WeightCache(tmp_path)
    cpu = torch.device("cpu")
    want = _make(0, "qkv")()
    cache.linear(TINY, 0, 0, "qkv", cpu, "reference", _make(0, "qkv"))
    cache.linear(TINY, 0, 0, "out", cpu, "reference", _make(0, "out"))
    qkv = cache.path(cache.key(TINY, 0, 0, "qkv", "cpu"))
    out = cache.path(cache.key(TINY, 0, 0, "out", "cpu"))
    qkv.write_bytes(qkv.read_bytes()[:100])  # truncated (written by something else)
    got = cache.linear(TINY, 0, 0, "qkv", cpu, "reference", _make(0, "qkv"))
    assert "unusable" in capsys.readouterr().err and _same_linear(got, want)
    assert _same_linear(cache.linear(TINY, 0, 0, "qkv", cpu, "reference",
                                     lambda: pytest.fail("packed again")), want)  # replaced
    qkv.write_bytes(out.read_bytes())  # another weight's file under this name
    got = cache.linear(TINY, 0, 0, "qkv", cpu, "reference", _make(0, "qkv"))
    assert "another weight's" in capsys.readouterr().err and _same_linear(got, want)


def test_an_unwritable_cache_is_said_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    cache = W.WeightCache(tmp_path)

    def full(obj, f, *a, **k):
        f.write(b"half a file")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(W.torch, "save", full)
    got = cache.linear(TINY, 0, 1, "fc2", torch.device("cpu"), "reference", _make(1, "fc2"))
    assert _same_linear(got, _make(1, "fc2")())
    assert "could not store" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # neither a partial file nor its temporary


def test_p0_packing_goes_through_the_cache_too(tmp_path, monkeypatch):
    """The p0 path's cache logic with CPU tensors: a p0 root model's key says its weights are
    quantized on CUDA (a file of its own), and what loads is a p0 linear with the same bits.
    (The CUDA placement is faked: no GPU here.)"""
    from models import nvfp4_linear as L

    def resolve(backend, role):
        return backend
    monkeypatch.setattr(W, "resolve_backend", resolve)
    monkeypatch.setattr(L, "resolve_backend", resolve)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    cache = W.WeightCache(tmp_path)
    cpu = torch.device("cpu")

    def make():
        return Nvfp4Linear(weight(TINY, 0, 1, "out"), role="out").with_backend("p0")
    first = cache.linear(TINY, 0, 1, "out", cpu, "p0", make)
    again = cache.linear(TINY, 0, 1, "out", cpu, "p0", lambda: pytest.fail("packed again"))
    assert again.backend == "p0" and _same_linear(again, first)
    # a loaded linear carries everything a launch path reads, as a constructed one does
    for attr in ("_g_w_dev", "_w_pre", "_plans", "_last", "ring_capacity"):
        assert hasattr(again, attr), attr
    assert again.ring_capacity == first.ring_capacity and again._plans == {}
    (path,) = tmp_path.iterdir()
    assert path == cache.path(cache.key(TINY, 0, 1, "out", "cuda"))
    assert torch.load(path, weights_only=True)["key"]["quantized_on"] == "cuda"


def test_a_cache_under_results_is_refused(tmp_path, monkeypatch):
    with pytest.raises(WorkbenchError, match="holds results only"):
        W.WeightCache(R.REPO_ROOT / "results" / "runs" / "weights")
    monkeypatch.setenv("WB_PUBLISHED_DIR", str(tmp_path / "pub"))
    with pytest.raises(WorkbenchError, match="holds results only"):
        W.WeightCache(tmp_path / "pub" / "w")
    (tmp_path / "file").write_text("")
    with pytest.raises(WorkbenchError, match="not a folder"):
        W.WeightCache(tmp_path / "file")
    monkeypatch.delenv(W.ENV, raising=False)
    assert W.from_env() is None
    monkeypatch.setenv(W.ENV, str(tmp_path / "w"))
    assert W.from_env().root == (tmp_path / "w").resolve()


def test_derived_models_take_their_weights_from_the_source(tmp_path):
    """A derived model (another backend, wrap or device) packs nothing: every weight is
    packed once, by the model it derives from, whichever asks first."""
    cache = W.WeightCache(tmp_path)
    ref = H3Model(TINY, seed=0, weight_cache=cache)
    other = ref.derived(wrap=lambda b, r, lin: lin).derived(device="cpu")
    assert other._source is None and other._linears is ref._linears  # same device, backend
    # a model on another device index (here a fake one: no GPU) takes and moves them
    moved = H3Model(TINY, seed=0)
    moved._source = ref
    lins = moved.linears(1)
    assert cache.packed == 4 and set(ref._linears) == {1}
    assert all(_same_linear(lins[r], ref.linears(1)[r]) for r in ROLES)
    assert all(lins[r] is not ref.linears(1)[r] for r in ROLES)


def test_the_ladder_takes_the_cache_from_the_environment(tmp_path, monkeypatch):
    from validators import runner

    monkeypatch.setenv(W.ENV, str(tmp_path / "w"))
    runner._REFERENCE.clear()
    try:
        ref = runner._reference(True, "cpu")
        assert ref.weight_cache.root == (tmp_path / "w").resolve()
        assert ref.derived(backend="reference").weight_cache is ref.weight_cache
    finally:
        runner._REFERENCE.clear()
