"""Generated code is fresh, and what was generated from nvml.h is what a C compiler reads there."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mokkafs.model import nvml_consts

pytestmark = pytest.mark.level("model")

REPO = Path(__file__).resolve().parents[1]

# table -> how nvml.h spells an entry's C name from its suffix
C_NAMES = {
    "CLOCKS_EVENT_REASONS": lambda s: f"nvmlClocksThrottleReason{s}" if s.startswith("Hw") else f"nvmlClocksEventReason{s}",
    "EVENT_TYPES": lambda s: f"nvmlEventType{s}",
    "BRANDS": lambda s: f"NVML_BRAND_{s}",
    "DEVICE_ARCHS": lambda s: f"NVML_DEVICE_ARCH_{s}",
    "ADDRESSING_MODES": lambda s: f"NVML_DEVICE_ADDRESSING_MODE_{s}",
    "NVLINK_DEVICE_TYPES": lambda s: f"NVML_NVLINK_DEVICE_TYPE_{s}",
    "TOPOLOGY_LEVELS": lambda s: f"NVML_TOPOLOGY_{s}",
    "RECOVERY_ACTIONS": lambda s: f"NVML_GPU_RECOVERY_ACTION_{s}",
    "SYSTEM_EVENT_TYPES": lambda s: f"nvmlSystemEventType{s}",
}


def test_every_generated_nvml_constant_is_what_the_compiler_reads_in_nvml_h(tmp_path):
    """The generator parses nvml.h with patterns; cc reads it as C. Every value must agree, so a
    pattern that caught a wrong number (a comment, an alias) cannot hide."""
    tables = {name: getattr(nvml_consts, name) for name in C_NAMES}
    assert all(tables.values()) and set(C_NAMES) == {n for n in dir(nvml_consts) if n.isupper()}
    rows = [(f"{t}.{s}", C_NAMES[t](s)) for t, values in tables.items() for s in values]
    src = tmp_path / "consts.c"
    src.write_text('#include <stdio.h>\n#include "nvml.h"\nint main(void) {\n'
                   + "".join(f'    printf("%s %lld\\n", "{key}", (long long)({c}));\n' for key, c in rows)
                   + "    return 0;\n}\n")
    subprocess.run(["cc", "-I", str(REPO / "shims" / "include"), "-o", str(tmp_path / "consts"), str(src)], check=True)
    out = subprocess.run([str(tmp_path / "consts")], capture_output=True, text=True, check=True).stdout
    compiled = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
    ours = {f"{t}.{s}": v for t, values in tables.items() for s, v in values.items()}
    # nvml.h's UNKNOWN architecture is 0xffffffff in an unsigned enum: compare as unsigned 32 bits where C said -1
    assert {k: v & 0xFFFFFFFF if v < 0 else v for k, v in compiled.items()} == ours


@pytest.mark.level("tools")
def test_every_generator_is_fresh():
    """scripts/generate.py --check: each generator's committed output is what it makes now (the
    cuda generator fetches its wheel once into the cache)."""
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "generate.py"), "--check"], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_models_state_limits_are_the_layouts():
    """mokkafs/model/state_limits.py (generated) holds what cffi reads in mokka_state.h, the header
    the shims compile against: the model's bounds (GPUs, NVLinks, MIG instances) are the layout's."""
    from mokkafs.daemon.shm.layout import libc
    from mokkafs.model import state_limits

    names = [n for n in dir(state_limits) if n.isupper()]
    assert len(names) > 10
    assert {n: getattr(state_limits, n) for n in names} == {n: getattr(libc, f"MOKKA_{n}") for n in names}
