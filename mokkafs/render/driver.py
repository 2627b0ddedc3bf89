"""driver/: a driver root as `--driver-root` users expect (usr/lib64/libnvidia-ml.so.*), whose
libraries are symlinks to the shims this package built, named like the real driver's files."""
from __future__ import annotations

from mokkafs import native
from mokkafs.model import NodeConfig
from mokkafs.vfs import Dir, Symlink, static_dir


def lib64_children(config: NodeConfig) -> dict[str, Symlink]:
    """As the driver installs them: the soname links to the versioned file, which is ours.
    nvidia-ctk infers the driver version from the `.so.<version>` suffix."""
    versioned = f"libnvidia-ml.so.{config.driver_version}"
    cuda_versioned = f"libcuda.so.{config.driver_version}"
    return {
        versioned: Symlink(str(native.LIB_DIR / native.NVML_SONAME)),
        native.NVML_SONAME: Symlink(versioned),
        # libcuda.so (the development link) too: numba loads `libcuda.so` before `libcuda.so.1`.
        cuda_versioned: Symlink(str(native.LIB_DIR / native.CUDA_SONAME)),
        native.CUDA_SONAME: Symlink(cuda_versioned),
        "libcuda.so": Symlink(native.CUDA_SONAME),
    }


def driver_tree(config: NodeConfig) -> Dir:
    lib64 = static_dir(lib64_children(config))
    # usr/bin/nvidia-smi: the native tool setup.py builds beside the libraries (shims/nvidia-smi)
    bin_dir = static_dir({"nvidia-smi": Symlink(str(native.LIB_DIR.parent / "bin" / "nvidia-smi"))})
    return static_dir({"usr": static_dir({"lib64": lib64, "bin": bin_dir})})
