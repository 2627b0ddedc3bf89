"""Builds the native shims (shims/) with the system C compiler into the package, so that
`pip install .` (and `pip install -e .`) ship mokkafs/_native/lib/libnvidia-ml.so.1.
Everything else about the package is in pyproject.toml."""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
SHIMS = HERE / "shims"
CFLAGS = ["-O2", "-g", "-fPIC", "-Wall", "-Wextra", "-std=gnu11"]
# The one client of the shared state (finding, mapping, validating, reading it), compiled into
# each of the three shims; each keeps its own hidden copy.
# mokka_view.c decides, at init, which of the node's devices the process can open.
CLIENT = ["-I", str(SHIMS / "common"), str(SHIMS / "common" / "mokka_client.c"), str(SHIMS / "common" / "mokka_view.c")]
# The client of the daemon's control socket, for the shims that change the node (setters).
CONTROL = [str(SHIMS / "common" / "mokka_control.c")]


def nvml_sources() -> list[str]:
    """Every C file of shims/libnvml: the hand-written domain files (nvml_<domain>.c, behind
    nvml_internal.h) and the generated stubs. shims/gen_nvml.py reads the same set, less the
    stubs, to know which functions are hand-written."""
    return [str(p) for p in sorted((SHIMS / "libnvml").glob("*.c"))]


def smi_sources() -> list[str]:
    """Every C file of shims/nvidia-smi: one per mode behind smi.h, and the generated smi_gen.c
    and smi_values_gen.c."""
    return [str(p) for p in sorted((SHIMS / "nvidia-smi").glob("*.c"))]


def build_state_ffi(out: Path) -> None:
    """The shared state's declarations parsed once, here, into mokkafs/_native/mokka_state_ffi.py
    (mokkafs/daemon/shm/ffi_module.py, loaded by its path: the package is not importable yet)."""
    spec = importlib.util.spec_from_file_location("_mokka_ffi_module", HERE / "mokkafs" / "daemon" / "shm" / "ffi_module.py")
    ffi_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ffi_module)
    ffi_module.write(SHIMS / "include" / "mokka_state.h", out)


def compile_package() -> None:
    """An editable install runs the package from the checkout, where nothing compiled it ahead
    (pip compiles a wheel's modules as it installs them): with PYTHONDONTWRITEBYTECODE set, every
    `mokka` command compiled ~0.1 s of the package's source again at each start. Compile it here,
    as an install would; a module edited since is compiled again in memory, as before."""
    import compileall

    compileall.compile_dir(str(HERE / "mokkafs"), quiet=1, rx=re.compile(r"/_native/"))


def build_nvml(out: Path) -> None:
    cc = shlex.split(os.environ.get("CC", "cc"))
    (out / "lib").mkdir(parents=True, exist_ok=True)
    (out / "include").mkdir(parents=True, exist_ok=True)
    shutil.copy2(SHIMS / "include" / "mokka_state.h", out / "include" / "mokka_state.h")
    shutil.copy2(SHIMS / "common" / "mokka_control.h", out / "include" / "mokka_control.h")
    src = SHIMS / "libnvml"
    target = out / "lib" / "libnvidia-ml.so.1"
    cmd = [
        *cc, *CFLAGS, "-shared", "-I", str(SHIMS / "include"),
        f"-Wl,--version-script={src / 'libnvidia-ml.map'}", "-Wl,-soname,libnvidia-ml.so.1", "-Wl,--no-undefined",
        *nvml_sources(), *CLIENT, *CONTROL, "-pthread", "-ldl", "-o", str(target) + ".tmp",
    ]
    print(" ".join(cmd))
    subprocess.run(cmd, check=True)
    os.replace(str(target) + ".tmp", target)
    (out / ".gitignore").write_text("# build output of setup.py\n*\n")


def build_cuda(out: Path) -> None:
    """libcuda.so.1 (shims/libcuda), next to libnvidia-ml.so.1."""
    cc = shlex.split(os.environ.get("CC", "cc"))
    src = SHIMS / "libcuda"
    target = out / "lib" / "libcuda.so.1"
    cmd = [
        *cc, *CFLAGS, "-shared", "-I", str(SHIMS / "include"), "-I", str(src),
        f"-Wl,--version-script={src / 'libcuda.map'}", "-Wl,-soname,libcuda.so.1", "-Wl,--no-undefined",
        *sorted(str(p) for p in src.glob("*.c")), *CLIENT, "-pthread", "-ldl", "-o", str(target) + ".tmp",
    ]
    print(" ".join(cmd))
    subprocess.run(cmd, check=True)
    os.replace(str(target) + ".tmp", target)
    # libcuda.so, as the driver root has it: numba and nvitop try it before libcuda.so.1, and
    # `mokka run` / `mokka env` point LD_LIBRARY_PATH here (docs/containers.md).
    dev_link = out / "lib" / "libcuda.so"
    if not dev_link.is_symlink():
        dev_link.unlink(missing_ok=True)
        dev_link.symlink_to("libcuda.so.1")


def build_smi(out: Path) -> None:
    """bin/nvidia-smi: links only libc; it dlopens libnvidia-ml.so.1 at run time (shims/nvidia-smi).
    Its RUNPATH is $ORIGIN/../lib64: in a driver root (<R>/usr/bin) it finds <R>/usr/lib64's NVML
    without LD_LIBRARY_PATH (which still comes first), and so reads that tree's node."""
    cc = shlex.split(os.environ.get("CC", "cc"))
    (out / "bin").mkdir(parents=True, exist_ok=True)
    target = out / "bin" / "nvidia-smi"
    cmd = [*cc, *CFLAGS, "-I", str(SHIMS / "include"), *smi_sources(), *CLIENT, *CONTROL,
           "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../lib64", "-pthread", "-ldl", "-o", str(target) + ".tmp"]
    print(" ".join(cmd))
    subprocess.run(cmd, check=True)
    os.replace(str(target) + ".tmp", target)


def build_fence(out: Path) -> None:
    """lib/libmokka-fence.so: a memory barrier for the daemon's stores on weakly ordered CPUs."""
    cc = shlex.split(os.environ.get("CC", "cc"))
    target = out / "lib" / "libmokka-fence.so"
    cmd = [*cc, *CFLAGS, "-shared", str(SHIMS / "libmokka" / "fence.c"), "-o", str(target) + ".tmp"]
    print(" ".join(cmd))
    subprocess.run(cmd, check=True)
    os.replace(str(target) + ".tmp", target)


def build_umad(out: Path) -> None:
    """lib/libibumad.so.3 (shims/libibumad): the umad_* ABI of rdma-core's library, answering
    MADs from the node's fabric (docs/infiniband.md); links only libc."""
    cc = shlex.split(os.environ.get("CC", "cc"))
    src = SHIMS / "libibumad"
    target = out / "lib" / "libibumad.so.3"
    cmd = [
        *cc, *CFLAGS, "-fvisibility=hidden", "-shared", "-I", str(src),
        f"-Wl,--version-script={src / 'libibumad.map'}", "-Wl,-soname,libibumad.so.3", "-Wl,--no-undefined",
        str(src / "umad.c"), str(src / "umad_fabric.c"), "-pthread", "-ldl", "-o", str(target) + ".tmp",
    ]
    print(" ".join(cmd))
    subprocess.run(cmd, check=True)
    os.replace(str(target) + ".tmp", target)


def build_hook(out: Path) -> None:
    """bin/mokka-cdi-hook (shims/hook): the createContainer hook the agent's CDI spec names, which
    gives a container the node's /proc/driver (docs/containers.md). A runtime runs it on the host,
    whose libc may be older than the one it was built against: it is linked static."""
    cc = shlex.split(os.environ.get("CC", "cc"))
    (out / "bin").mkdir(parents=True, exist_ok=True)
    target = out / "bin" / "mokka-cdi-hook"
    cmd = [*cc, *[f for f in CFLAGS if f != "-fPIC"], "-static", str(SHIMS / "hook" / "mokka_cdi_hook.c"),
           "-o", str(target) + ".tmp"]
    print(" ".join(cmd))
    subprocess.run(cmd, check=True)
    os.replace(str(target) + ".tmp", target)


class BuildPyWithShims(build_py):
    def run(self) -> None:
        super().run()
        out = HERE / "mokkafs" / "_native" if getattr(self, "editable_mode", False) else \
            Path(self.build_lib) / "mokkafs" / "_native"
        build_nvml(out)
        build_smi(out)
        build_cuda(out)
        build_fence(out)
        build_umad(out)
        build_hook(out)
        build_state_ffi(out)
        if getattr(self, "editable_mode", False):
            compile_package()


class BinaryDistribution(Distribution):
    """The wheel carries a native library: tag it for the platform, not py3-none-any."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildPyWithShims}, distclass=BinaryDistribution)
