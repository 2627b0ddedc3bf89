"""driver/: a self-contained driver root, what `--driver-root` / `NVIDIA_DRIVER_ROOT` users
expect: usr/lib64/libnvidia-ml.so.* and libcuda.so.*, usr/bin/nvidia-smi and dev/nvidia*.

The libraries and the tool are regular files whose bytes are the shims this package built, so
a container that mounts only this directory (the device plugin's /driver-root) has them all;
the sonames are relative links to the versioned files, as the driver installs them. run/mokka
links to the node's state directory, so the shims find their own node (docs/nvml.md)."""
from __future__ import annotations

import logging
from pathlib import Path

from mokkafs.render import native
from mokkafs.model import NodeConfig
from mokkafs.render.vfs import Dir, Entry, File, SocketPlaceholder, Symlink, static_dir

log = logging.getLogger(__name__)


def _built(path: Path) -> File | None:
    """The built file's bytes, read once; the loader maps them, so they go through the page
    cache (exact_size), never direct_io."""
    try:
        data = path.read_bytes()
    except OSError as e:
        log.warning("%s: %s; the driver root will not have it (reinstall mokkafs to build the shims)", path,
                    e.strerror)
        return None
    return File(lambda ctx: data, mode=0o755, size=len(data), exact_size=True)


def lib64_children(config: NodeConfig) -> dict[str, Entry]:
    """As the driver installs them: the soname links to the versioned file, which is ours.
    nvidia-ctk infers the driver version from the `.so.<version>` suffix."""
    out: dict[str, Entry] = {}
    for soname, stem in ((native.NVML_SONAME, "libnvidia-ml.so"), (native.CUDA_SONAME, "libcuda.so")):
        versioned = f"{stem}.{config.driver_version}"
        built = _built(native.LIB_DIR / soname)
        if built is None:
            continue
        out[versioned] = built
        out[soname] = Symlink(versioned)
    if native.CUDA_SONAME in out:
        # libcuda.so (the development link) too: numba loads `libcuda.so` before `libcuda.so.1`.
        out["libcuda.so"] = Symlink(native.CUDA_SONAME)
    # libibumad.so.3: infiniband-diags' MADs answered from the node's fabric (docs/infiniband.md);
    # on a node without HCAs it lists no CA, as rdma-core's would.
    umad = _built(native.LIB_DIR / native.UMAD_SONAME)
    if umad is not None:
        out[native.UMAD_SONAME] = umad
    return out


# The node's socket in the state directory (mokkafs/daemon/node_socket.py serves it).
NODE_SOCKET = "node.sock"
# Where the driver root has nvidia-persistenced's socket, and NVIDIA's CDI specs look for it.
PERSISTENCED_SOCKET = "run/nvidia-persistenced/socket"


def driver_tree(config: NodeConfig, dev: Dir, proc: Dir | None = None, state_dir: str | None = None,
                bind_node_socket: bool = False) -> Dir:
    """`bind_node_socket`: the daemon binds the node's socket over run/nvidia-persistenced/socket
    (mokkafs/daemon/socket_bind.py), so the name is a socket placeholder here; else a link."""
    lib64 = static_dir(lib64_children(config))
    # usr/bin/nvidia-smi: the native tool setup.py builds beside the libraries (shims/nvidia-smi)
    # usr/bin/mokka-cdi-hook: the createContainer hook the agent's CDI spec runs on the host, which
    # gives a container the node's /proc/driver and /proc/devices (shims/hook; docs/containers.md). Not a driver
    # file: no spec mounts it into a container.
    tools = {name: _built(native.LIB_DIR.parent / "bin" / name) for name in ("nvidia-smi", native.CDI_HOOK)}
    bin_dir = static_dir({name: f for name, f in tools.items() if f is not None})
    # dev/: the device plugin looks for /dev/nvidia* under the driver root (its devRoot).
    children: dict[str, Entry] = {"usr": static_dir({"lib64": lib64, "bin": bin_dir}), "dev": dev}
    if proc is not None:
        # proc/: nvidia-container-toolkit joins the driver root with
        # /proc/driver/nvidia-caps/mig-minors and reads the capability files there.
        children["proc"] = proc
    if state_dir is not None:
        # run/mokka: this node's state directory (absolute), where a shim loaded from
        # usr/lib64 or usr/bin looks first when MOKKA_STATE is unset, as a container given the
        # state directory at /run/mokka does; so a shim reads the node of the tree it came from.
        # run/nvidia-persistenced/socket: the node's socket (mokkafs/daemon/node_socket.py), which
        # NVIDIA's CDI specs mount at /run/nvidia-persistenced/socket; a shim in such a
        # container gets the state file's descriptor there. A daemon that may mount binds the
        # socket itself over the name, which then survives a bind of the driver root alone (a
        # pod's hostPath); an unprivileged one leaves a link to it (docs/containers.md).
        sock: Entry = SocketPlaceholder() if bind_node_socket else Symlink(f"{state_dir}/{NODE_SOCKET}")
        persistenced = static_dir({"socket": sock})
        children["run"] = static_dir({"mokka": Symlink(state_dir), "nvidia-persistenced": persistenced})
    return static_dir(children)
