"""libnvidia-ml.so.1 exports every symbol the real driver's library does, and the generated
stubs and export list are fresh."""
from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_nvml import nvml_path


pytestmark = pytest.mark.level("shims")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_generated_files_are_fresh():
    r = subprocess.run([sys.executable, str(ROOT / "shims" / "gen_nvml.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_590_symbol_is_exported():
    lib = ctypes.CDLL(str(nvml_path()))
    wanted = (FIXTURES / "nvml-symbols-590.48.01.txt").read_text().split()
    assert len(wanted) == 405
    missing = [name for name in wanted if not hasattr(lib, name)]
    assert missing == []


def test_every_header_function_is_exported():
    sys.path.insert(0, str(ROOT / "shims"))
    try:
        import gen_nvml
    finally:
        sys.path.pop(0)
    lib = ctypes.CDLL(str(nvml_path()))
    names = gen_nvml.exports()
    assert len(names) > 400
    assert [n for n in names if not hasattr(lib, n)] == []
    # The probes consumers make to pick an ABI must all find their symbol.
    for probe in ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetComputeRunningProcesses_v3",
                  "nvmlDeviceGetConfComputeMemSizeInfo", "nvmlDeviceGetDriverModel_v2", "nvmlInit_v2", "nvmlEventSetWait_v2"):
        assert hasattr(lib, probe)


def test_unimplemented_functions_say_not_supported():
    lib = ctypes.CDLL(str(nvml_path()))
    assert lib.nvmlDeviceGetNvLinkInfo() == 3
    lib.nvmlErrorString.restype = ctypes.c_char_p
    assert lib.nvmlErrorString(3) == b"Not Supported"
    assert lib.nvmlErrorString(15) == b"GPU is lost"
    assert lib.nvmlErrorString(12345) == b"Unknown Error"
