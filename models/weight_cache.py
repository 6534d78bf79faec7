"""An opt-in on-disk cache of H3's packed weights: a resumed ladder call (or a second
trajectory run) loads them instead of drawing and quantizing them again, which took ~100 s a
call at the full config (notes/h3-ladder.md).

One file per (block, role), ``<root>/h3-b<block>-<role>-<key>.pt``, holding the packed weight
(Nvfp4Linear.packed: E2M1 codes, swizzled E4M3 scales, g_w) and the fields of its key. The key
is a sha256 of everything that decides those bytes: FORMAT (bumped when the file's layout
changes), the config's fields, the seed, block and role, the weight's dtype, the device type
that quantizes (the quantizer gives the same bits on CPU and CUDA, rungs 1b and 2a check it,
but the cache does not lean on that), torch's version (the CPU generator the weights are drawn
from) and the text of the code that draws and quantizes them, so an edit there can never load
stale bytes. A file is written under a temporary name and renamed into place (a killed call
leaves no partial file under a real name) and loaded with torch.load(map_location=device,
weights_only=True); one that does not load, or whose stored key differs from the wanted one, is
packed again and replaced, saying so on stderr. A cache that cannot be written is an
optimisation lost, not an error: it says so and the run goes on.

Enabled by ``H3Model(weight_cache=...)``; the ladder and experiments.h3_trajectory take
$WB_WEIGHT_CACHE (:func:`from_env`), which scripts/device_call.sh sets on the device machine
(a folder on its local disk, never under results/: a cache there is refused).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from models.nvfp4_linear import Nvfp4Linear, resolve_backend
from workbench import WorkbenchError
from workbench import results as R

ENV = "WB_WEIGHT_CACHE"
FORMAT = 1
# the code whose text decides a packed weight's bytes: the weights' draw (models/h3.py), the
# linear's packing (models/nvfp4_linear.py) and the quantizer with what it calls
_SOURCES = ("models/h3.py", "models/nvfp4_linear.py", "numerics/nvfp4.py",
            "numerics/formats.py", "numerics/rcp.py")
_source_digest: str | None = None


def source_digest() -> str:
    """sha256 of the code that draws and packs the weights (read once a process)."""
    global _source_digest
    if _source_digest is None:
        h = hashlib.sha256()
        for rel in _SOURCES:
            h.update(rel.encode() + b"\0" + (R.REPO_ROOT / rel).read_bytes() + b"\0")
        _source_digest = h.hexdigest()
    return _source_digest


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder.resolve())
    except ValueError:
        return False
    return True


class WeightCache:
    """The cache folder ``root`` (made on the first store). WorkbenchError for a root inside
    the project's results/ (or $WB_PUBLISHED_DIR), or one that exists and is not a folder."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().resolve()
        for results in {R.REPO_ROOT / "results", R.published_dir()}:
            if _inside(self.root, results):
                raise WorkbenchError(f"weight cache {root}: inside {results}, which holds "
                                     "results only; put the cache on local disk elsewhere "
                                     "(e.g. /tmp/wb-weights)")
        if self.root.exists() and not self.root.is_dir():
            raise WorkbenchError(f"weight cache {root}: exists and is not a folder")
        self.loaded = self.packed = 0  # linears this process loaded / packed (and stored)

    def key(self, cfg, seed: int, block: int, role: str, quantize_on: str) -> dict:
        """The fields that decide the bytes of (block, role)'s packed weight."""
        return {"format": FORMAT, "config": asdict(cfg), "seed": seed, "block": block,
                "role": role, "weight_dtype": "bfloat16", "quantized_on": quantize_on,
                "torch": str(torch.__version__), "source": source_digest()}

    def path(self, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
        return self.root / f"h3-b{key['block']}-{key['role']}-{digest[:24]}.pt"

    def linear(self, cfg, seed: int, block: int, role: str, device: torch.device,
               backend: str, make) -> Nvfp4Linear:
        """(block, role)'s linear on ``device`` behind ``backend``: loaded when its file is
        there and holds this key, else ``make()`` (the constructor from the bf16 weight),
        stored for the next call."""
        backend = resolve_backend(backend, role)
        key = self.key(cfg, seed, block, role, "cuda" if backend == "p0" else device.type)
        path = self.path(key)
        if path.is_file():
            try:
                saved = torch.load(path, map_location=device, weights_only=True)
                if saved.get("key") != key:
                    raise ValueError("its stored key is another weight's")
                lin = Nvfp4Linear.from_packed(saved["w_q"], saved["w_s"], saved["g_w"],
                                              backend=backend, role=role)
                self.loaded += 1
                return lin
            except Exception as e:  # noqa: BLE001  # any unreadable file is packed again
                print(f"weight cache: {path.name} unusable ({type(e).__name__}: {e}); "
                      "packing that weight again", file=sys.stderr)
        lin = make()
        self.packed += 1
        self._store(path, key, lin.packed())
        return lin

    def _store(self, path: Path, key: dict, packed: dict) -> None:
        """Write to a temporary name in the folder, then rename: all of a file or none."""
        tmp = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{path.name}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                torch.save({"key": key, **packed}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            print(f"weight cache: could not store {path.name} ({e}); going on without it",
                  file=sys.stderr)
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)


def from_env() -> WeightCache | None:
    """The cache $WB_WEIGHT_CACHE names, or None when it is unset or empty."""
    root = os.environ.get(ENV)
    return WeightCache(root) if root else None
