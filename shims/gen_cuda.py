#!/usr/bin/env python3
"""Generate libcuda's export list, NOT_SUPPORTED stubs, cuGetProcAddress table and error names
from NVIDIA's cuda.h and its *Typedefs.h.

NVIDIA's notice on cuda.h forbids redistributing it, so it is not vendored: the script reads it
from the `nvidia-cuda-runtime` wheel (pinned below; fetched with `pip download` into a cache, or
given with --include). Only names, versions and numbers reach the generated files.

- exports: every function cuda.h and cudaGL/EGL/VDPAU.h declare, the old ABI variants its
  `#define cuX cuX_vN` macros hide, and the `_ptds`/`_ptsz` per-thread-stream variants.
- cuGetProcAddress table: from the `PFN_<name>_v<version>[_ptds|_ptsz]` typedefs, each
  (name, version) -> the ABI variant the real driver returns for it.
- every export libcuda/*.c does not define gets a stub returning CUDA_ERROR_NOT_SUPPORTED.

    python shims/gen_cuda.py [--check] [--include DIR]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The hand-written sources: every libcuda/*.c but the generated one.
HAND_WRITTEN = HERE / "libcuda"
STUBS = HERE / "libcuda" / "cuda_gen.c"
EXPORT_MAP = HERE / "libcuda" / "libcuda.map"

WHEEL = "nvidia-cuda-runtime==13.5.37"
HEADERS = ["cuda.h", "cudaGL.h", "cudaEGL.h", "cudaVDPAU.h"]
TYPEDEFS = ["cudaTypedefs.h", "cudaGLTypedefs.h", "cudaEGLTypedefs.h", "cudaVDPAUTypedefs.h", "cudaProfilerTypedefs.h"]
# Exported by the real driver but absent from the wheel's headers (cudart's bootstrap;
# cudaProfiler.h).
EXTRA_EXPORTS = ["cuGetExportTable", "cuProfilerInitialize", "cuProfilerStart", "cuProfilerStop"]
# cuda.h 12+ renames cuGraphInstantiate to another function, which no PFN typedef records.
RENAMED = {("cuGraphInstantiate", 12000): "cuGraphInstantiateWithFlags"}

# A definition, or another ABI name of one (MOKKA_ALIAS(cuX_ptsz, cuX), cuda_internal.h's).
_DEFINED = re.compile(r"^(?:CUresult\s+(?:CUDAAPI\s+)?|MOKKA_ALIAS\()(cu\w+)\s*[(,]", re.M)


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def find_include(given: str | None) -> Path:
    if given:
        return Path(given)
    if os.environ.get("MOKKA_CUDA_INCLUDE"):
        return Path(os.environ["MOKKA_CUDA_INCLUDE"])
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mokkafs" / WHEEL.replace("==", "-")
    include = cache / "include"
    if (include / "cuda.h").is_file():
        return include
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", tmp], check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        include.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if re.fullmatch(r"nvidia/cu\d+/include/[^/]+\.h", name) and Path(name).name in HEADERS + TYPEDEFS:
                    (include / Path(name).name).write_bytes(z.read(name))
    return include


class Api:
    """What the headers say: exported names, the ProcAddress table and the CUresult names."""

    def __init__(self, include: Path) -> None:
        declared: set[str] = set()
        self.macro: dict[str, str] = {}  # base name -> the default ABI variant
        ptds: set[str] = set()
        for h in HEADERS:
            text = _strip_comments((include / h).read_text())
            declared |= set(re.findall(r"CUresult\s+CUDAAPI\s+(cu\w+)\s*\(", text))
            for m in re.finditer(r"#define\s+(cu\w+)\s+__CUDA_API_PT(DS|SZ)\((cu\w+)\)", text):
                self.macro.setdefault(m.group(1), m.group(3))
                ptds.add(f"{m.group(3)}_pt{m.group(2).lower()}")
            for m in re.finditer(r"#define\s+(cu\w+)\s+(cu\w+)\s*$", text, re.M):
                self.macro.setdefault(m.group(1), m.group(2))
        self.exports = sorted(declared | set(self.macro.values()) | ptds | set(EXTRA_EXPORTS))
        pfn: dict[str, set[tuple[int, str]]] = {}
        for h in TYPEDEFS:
            text = (include / h).read_text()
            for m in re.finditer(r"\*\s*PFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\)", text):
                pfn.setdefault(m.group(1), set()).add((int(m.group(2)), m.group(3) or ""))
        self.table = self._resolve(pfn)
        cuda_h = _strip_comments((include / "cuda.h").read_text())
        enum = re.search(r"typedef enum cudaError_enum \{(.*?)\}", cuda_h, re.S).group(1)
        self.errors = [(int(v), n) for n, v in re.findall(r"(CUDA_\w+)\s*=\s*(\d+)", enum)]

    def _variants(self, base: str) -> list[str]:
        found = []
        for name in self.exports:
            m = re.fullmatch(re.escape(base) + r"(?:_v(\d+))?", name)
            if m:
                found.append((int(m.group(1) or 1), name))
        return [n for _, n in sorted(found)]

    def _resolve(self, pfn: dict[str, set[tuple[int, str]]]) -> list[tuple[str, int, int, str]]:
        """(name, version, per-thread-stream, symbol) rows. With as many variants (cuX, cuX_v2,
        ...) as typedef versions, they pair in order; otherwise the newest version is the variant
        cuda.h's macro points at and the older versions take the older variants in order."""
        rows = []
        exported = set(self.exports)
        for base, entries in sorted(pfn.items()):
            versions = sorted(v for v, s in entries if not s)
            newest = self.macro.get(base, base)
            older = [n for n in self._variants(base) if n != newest]
            by_version: dict[int, str] = {}
            variants = self._variants(base)
            if len(variants) == len(versions):
                by_version = dict(zip(versions, variants))
            elif versions:
                by_version[versions[-1]] = newest
                for v, n in zip(reversed(versions[:-1]), reversed(older)):
                    by_version[v] = n
            for (name, v), symbol in RENAMED.items():
                if name == base:
                    by_version[v] = symbol
                    versions = sorted(set(versions) | {v})
            for v in versions:
                if by_version.get(v) in exported:
                    rows.append((base, v, 0, by_version[v]))
            for v, suffix in sorted(e for e in entries if e[1]):
                plain = [by_version[u] for u in versions if u <= v and u in by_version]
                symbol = f"{plain[-1] if plain else newest}{suffix}"
                if symbol in exported:
                    rows.append((base, v, 1, symbol))
        named = {r[0] for r in rows}
        for name in self.exports:  # names without a typedef: any version finds them
            if name not in named and not re.search(r"_v\d+$|_pt(ds|sz)$", name):
                rows.append((name, 0, 0, name))
        return sorted(rows)


def hand_written(source: Path = HAND_WRITTEN) -> set[str]:
    files = [source] if source.is_file() else sorted(p for p in source.glob("*.c") if p.name != STUBS.name)
    return {name for f in files for name in _DEFINED.findall(f.read_text())}


def render_stubs(api: Api, source: Path = HAND_WRITTEN) -> str:
    done = hand_written(source)
    lines = [
        "/* generated by shims/gen_cuda.py from cuda.h (" + WHEEL + "); do not edit. */",
        "/* Every exported CUDA driver function that the hand-written libcuda sources do not implement returns",
        "   CUDA_ERROR_NOT_SUPPORTED (801), named under MOKKA_CUDA_TRACE; the arguments are never read, so a prototype-less",
        "   definition is ABI-safe. Then the cuGetProcAddress table and the CUresult names. */",
        '#include "cuda_shim.h"',
        "",
        "CUresult mokka_not_supported(const char *name); /* cuda_export.c: traced under MOKKA_CUDA_TRACE */",
        "",
    ]
    for name in api.exports:
        if name not in done:
            lines.append(f'CUresult {name}(void) {{ return mokka_not_supported("{name}"); }}')
    lines.append("")
    for name in sorted(done & set(api.exports)):
        lines.append(f"extern CUresult {name}();")
    lines += ["", "const struct mokka_proc mokka_procs[] = {"]
    lines += [f'    {{"{n}", {v}, {p}, (void *){s}}},' for n, v, p, s in api.table]
    lines += ["};", "const unsigned mokka_procs_count = sizeof(mokka_procs) / sizeof(mokka_procs[0]);", ""]
    lines += ["const struct mokka_error_name mokka_error_names[] = {"]
    lines += [f'    {{{v}, "{n}"}},' for v, n in api.errors]
    lines += ["};", "const unsigned mokka_error_names_count = sizeof(mokka_error_names) / sizeof(mokka_error_names[0]);"]
    return "\n".join(lines) + "\n"


def render_map(api: Api) -> str:
    body = "".join(f"    {name};\n" for name in api.exports)
    return "/* generated by shims/gen_cuda.py from cuda.h; do not edit. */\n{\n  global:\n" + body + "  local:\n    *;\n};\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed outputs are stale")
    ap.add_argument("--include", help="a directory holding cuda.h and cudaTypedefs.h")
    args = ap.parse_args(argv)
    api = Api(find_include(args.include))
    missing = hand_written() - set(api.exports)
    if missing:
        print(f"libcuda/*.c defines names cuda.h does not export: {sorted(missing)}", file=sys.stderr)
        return 1
    outputs = {STUBS: render_stubs(api), EXPORT_MAP: render_map(api)}
    stale = [p for p, text in outputs.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(HERE.parent)} is stale: run python shims/gen_cuda.py", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(outputs[p])
        print(f"wrote {p.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
