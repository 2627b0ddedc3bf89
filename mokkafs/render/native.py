"""Where the native shims built by setup.py live inside the installed package."""
from __future__ import annotations

from pathlib import Path

LIB_DIR = Path(__file__).resolve().parents[1] / "_native" / "lib"
NVML_SONAME = "libnvidia-ml.so.1"
CUDA_SONAME = "libcuda.so.1"
UMAD_SONAME = "libibumad.so.3"
FENCE_LIBRARY = "libmokka-fence.so"
CDI_HOOK = "mokka-cdi-hook"  # in LIB_DIR's sibling bin/, with nvidia-smi


def nvml_library() -> Path:
    """The built libnvidia-ml.so.1; FileNotFoundError if the package was installed without it."""
    path = LIB_DIR / NVML_SONAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall mokkafs (`pip install .`) to build the shims")
    return path


def cuda_library() -> Path:
    """The built libcuda.so.1; FileNotFoundError if the package was installed without it."""
    path = LIB_DIR / CUDA_SONAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall mokkafs (`pip install .`) to build the shims")
    return path


def fence_library() -> Path:
    """The built libmokka-fence.so (the daemon's memory barrier on Arm)."""
    path = LIB_DIR / FENCE_LIBRARY
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall mokkafs (`pip install .`) to build the shims")
    return path
