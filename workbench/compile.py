"""Compile CuTe DSL kernels offline (no GPU needed) and report what the compiler made.

``compile_report(fn, *args, arch="sm_90a")`` runs ``cute.compile`` for the named arch and returns a
:class:`CompileReport`: PTX, cubin, SASS (when nvdisasm is installed), registers, static shared
memory, stack frame and spill bytes per kernel (read from the cubin's ``.nv.info``), and a census
of the instructions the workbench cares about. Compile tests assert on these.
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from workbench import WorkbenchError
from workbench.env import DEFAULT_ARCH, SUPPORTED_ARCHS

# PTX patterns counted by the census (name -> regex over PTX lines).
CENSUS_PATTERNS = {
    "wgmma.mma_async": r"\bwgmma\.mma_async",
    "cp.async.bulk.tensor": r"\bcp\.async\.bulk\.tensor",
    "cp.async.bulk": r"\bcp\.async\.bulk\.(?!tensor)",
    "mbarrier": r"\bmbarrier\.",
    "ld.acquire": r"\bld(\.global)?\.acquire",
    "red.release": r"\bred(\.global)?\.release",
    "atom": r"\batom\.",
    "fence.proxy.async": r"\bfence\.proxy\.async",
    "mapa": r"\bmapa\.",
    "st.async": r"\bst\.async",
    "ld.global.v4": r"\bld\.global(\.[a-z]+)*\.v4\.",
    "st.global.v4": r"\bst\.global(\.[a-z]+)*\.v4\.",
    "rcp.approx.ftz.f32": r"\brcp\.approx\.ftz\.f32",
    "cvt.e4m3x2": r"\bcvt\.rn\.satfinite\.e4m3x2\.f32",
    "nanosleep": r"\bnanosleep",
    "trap": r"\btrap;",
    "setmaxnreg": r"\bsetmaxnreg",
}


@dataclass
class KernelResources:
    name: str
    registers: int | None = None
    frame_bytes: int = 0
    min_stack_bytes: int = 0
    static_smem_bytes: int = 0


@dataclass
class CompileReport:
    arch: str
    ptx: str
    cubin: bytes
    sass: str | None
    kernels: list[KernelResources] = field(default_factory=list)
    census: dict[str, int] = field(default_factory=dict)
    compiled: object = None

    @property
    def registers(self) -> int:
        return max((k.registers or 0) for k in self.kernels) if self.kernels else 0

    @property
    def spill_bytes(self) -> int:
        """Local-memory traffic bytes: stack frame of every kernel plus LDL/STL seen in SASS."""
        frame = sum(k.frame_bytes for k in self.kernels)
        local_ops = len(re.findall(r"\b(LDL|STL)\b", self.sass)) if self.sass else 0
        return frame + local_ops

    @property
    def sass_instructions(self) -> int | None:
        """Instructions in the SASS listing (one a line after its /*offset*/); None without
        nvdisasm."""
        return len(re.findall(r"^\s*/\*[0-9a-f]+\*/\s+\S", self.sass, re.M)) if self.sass else None

    @property
    def spill_loads(self) -> int:
        """LDL instructions in SASS: a spilled register must be reloaded, while a stack frame that
        only holds ``printf`` arguments (e.g. a timeout message) is written with STL, never read."""
        return len(re.findall(r"\bLDL\b", self.sass)) if self.sass else 0

    @property
    def frame_bytes(self) -> int:
        return sum(k.frame_bytes for k in self.kernels)

    def summary(self) -> dict:
        return {
            "arch": self.arch,
            "registers": self.registers,
            "spill_bytes": self.spill_bytes,
            "spill_loads": self.spill_loads,
            "static_smem_bytes": max((k.static_smem_bytes for k in self.kernels), default=0),
            "kernels": [k.__dict__ for k in self.kernels],
            "census": self.census,
        }


def instruction_census(ptx: str) -> dict[str, int]:
    lines = [ln.split("//")[0] for ln in ptx.splitlines()]
    return {k: sum(1 for ln in lines if re.search(p, ln)) for k, p in CENSUS_PATTERNS.items()}


# --- cubin (ELF64) parsing ------------------------------------------------------------------
_EIATTR_FRAME_SIZE = 0x11
_EIATTR_MIN_STACK_SIZE = 0x12
_EIATTR_REGCOUNT = 0x2F


def _elf_sections(blob: bytes):
    if blob[:4] != b"\x7fELF" or blob[4] != 2:
        raise ValueError("not an ELF64 cubin")
    e_shoff, = struct.unpack_from("<Q", blob, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    secs = []
    for i in range(e_shnum):
        off = e_shoff + i * e_shentsize
        name, typ, _flags, _addr, offset, size, link, info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", blob, off)
        secs.append(dict(name_off=name, type=typ, offset=offset, size=size, link=link,
                         info=info, entsize=entsize))
    strtab = secs[e_shstrndx]
    for s in secs:
        start = strtab["offset"] + s["name_off"]
        s["name"] = blob[start:blob.index(b"\0", start)].decode()
    return secs


def _symbols(blob: bytes, secs) -> list[str]:
    symtab = next((s for s in secs if s["type"] == 2), None)
    if symtab is None:
        return []
    strtab = secs[symtab["link"]]
    names = []
    for i in range(symtab["size"] // 24):
        st_name, = struct.unpack_from("<I", blob, symtab["offset"] + i * 24)
        start = strtab["offset"] + st_name
        names.append(blob[start:blob.index(b"\0", start)].decode())
    return names


def _nv_info_records(data: bytes):
    i = 0
    while i + 4 <= len(data):
        fmt, attr = data[i], data[i + 1]
        if fmt == 0x04:  # EIFMT_SVAL: u16 size + payload
            size, = struct.unpack_from("<H", data, i + 2)
            yield attr, data[i + 4:i + 4 + size]
            i += 4 + size
        else:  # NVAL / BVAL / HVAL: fixed 4 bytes
            yield attr, data[i + 2:i + 4]
            i += 4


def cubin_resources(cubin: bytes) -> list[KernelResources]:
    """Registers, frame and static shared memory per kernel from the cubin's .nv.info."""
    secs = _elf_sections(cubin)
    syms = _symbols(cubin, secs)
    kernels: dict[str, KernelResources] = {}
    for s in secs:
        if s["name"].startswith(".text."):
            n = s["name"][len(".text."):]
            kernels[n] = KernelResources(name=n)
    for s in secs:
        if s["name"] == ".nv.info":
            data = cubin[s["offset"]:s["offset"] + s["size"]]
            for attr, payload in _nv_info_records(data):
                if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE, _EIATTR_MIN_STACK_SIZE) \
                        and len(payload) == 8:
                    sym, val = struct.unpack("<II", payload)
                    name = syms[sym] if sym < len(syms) else f"sym{sym}"
                    k = kernels.setdefault(name, KernelResources(name=name))
                    if attr == _EIATTR_REGCOUNT:
                        k.registers = val
                    elif attr == _EIATTR_FRAME_SIZE:
                        k.frame_bytes = val
                    else:
                        k.min_stack_bytes = val
        elif s["name"].startswith(".nv.shared.") and not s["name"].startswith(".nv.shared.reserved"):
            n = s["name"][len(".nv.shared."):]
            if n in kernels:
                kernels[n].static_smem_bytes = s["size"]
    return list(kernels.values())


def disassemble(cubin: bytes) -> str | None:
    """SASS text via nvdisasm (pip ``nvidia-cuda-nvdisasm`` or a CUDA toolkit), else None."""
    tool = shutil.which("nvdisasm")
    if tool is None:
        try:
            # here, not at the top: the pip CUDA wheels' namespace package, an optional fallback
            import nvidia

            for root in nvidia.__path__:
                for cand in sorted(Path(root).glob("cu*/bin/nvdisasm")) + sorted(
                        Path(root).glob("cuda_nvdisasm/bin/nvdisasm")):
                    tool = str(cand)
        except Exception:
            tool = None
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, f.name], capture_output=True, text=True, timeout=120)
    return out.stdout if out.returncode == 0 else None


def compile_report(fn, *args, arch: str = DEFAULT_ARCH, options: str = "", **kwargs) -> CompileReport:
    """``cute.compile(fn, *args)`` for ``arch`` without a GPU; returns the artifacts and resources."""
    if arch not in SUPPORTED_ARCHS:
        raise WorkbenchError(f"unsupported arch '{arch}'; choose one of {', '.join(SUPPORTED_ARCHS)}")
    import cutlass.cute as cute  # here: CuTe DSL fixes its arch (ensure_arch_env) on first import

    with tempfile.TemporaryDirectory() as dump:
        opts = f"--gpu-arch={arch} --keep-ptx --keep-cubin --dump-dir={dump} {options}".strip()
        compiled = cute.compile(fn, *args, options=opts, **kwargs)
        ptx = compiled.artifacts.PTX or ""
        cubin = compiled.artifacts.CUBIN or b""
        if not cubin:
            cub = sorted(Path(dump).glob("*.cubin"))
            cubin = cub[0].read_bytes() if cub else b""
    sass = disassemble(cubin) if cubin else None
    _dump_ptx(ptx)
    return CompileReport(arch=arch, ptx=ptx, cubin=cubin, sass=sass,
                         kernels=cubin_resources(cubin) if cubin else [],
                         census=instruction_census(ptx), compiled=compiled)


def _dump_ptx(ptx: str) -> None:
    """With WB_PTX_DUMP=<dir>, keep each compiled PTX under a name from the running pytest test
    (numbered in order), so PTX before and after a code move can be compared file by file."""
    dump = os.environ.get("WB_PTX_DUMP")
    if not dump:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "main").split(" ")[0]
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", test.split("::", 1)[-1])
    Path(dump).mkdir(parents=True, exist_ok=True)
    n = len(list(Path(dump).glob(f"{stem}.*.ptx")))
    (Path(dump) / f"{stem}.{n}.ptx").write_text(ptx)


def ensure_arch_env(arch: str = DEFAULT_ARCH) -> None:
    """Set CUTE_DSL_ARCH before cutlass is imported when there is no GPU to detect."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
