"""`mokka run -- CMD`: run CMD in a private mount namespace in which the node's simulated trees sit
at the real paths (/sys/bus/pci/devices, /sys/devices/pci*, /sys/class/infiniband*,
/proc/driver/nvidia*, /proc/devices, /dev/nvidia*), with the driver root on PATH and
LD_LIBRARY_PATH (docs/containers.md, "Where consumers load the shims from") and MOKKA_STATE set. The host's mount table is never changed.

How a path that does not exist on the host gets there: its parent directory is "shadowed" inside
the namespace only: a tmpfs is mounted over it, every host entry is bound back (except the ones
the simulation replaces), and the simulated entries are bound beside them.
"""
from __future__ import annotations

import ctypes
import errno
import filecmp
import fnmatch
import os
import stat
import sys
from dataclasses import dataclass, field

from mokkafs.cli.allocation import Gpu
from mokkafs.render import native

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_NOSUID = 0x2
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18

# Directories the namespace must never shadow: bringing every /proc/<pid> back is not possible.
_NEVER_SHADOW = {"/", "/proc", "/sys"}
PROC_MODULES = "/proc/modules"


class RunError(Exception):
    """Why CMD could not be started; the message is for the user."""


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.unshare.argtypes = [ctypes.c_int]


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    if _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source or fstype} on {target}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def enter_namespace() -> None:
    """A private mount namespace; as non-root, inside a user namespace that maps us to root."""
    try:
        _unshare(CLONE_NEWNS)
    except OSError as e:
        if e.errno != errno.EPERM or os.geteuid() == 0:
            raise RunError(f"cannot create a mount namespace: {e.strerror}") from None
        uid, gid = os.geteuid(), os.getegid()
        try:
            _unshare(CLONE_NEWUSER | CLONE_NEWNS)
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write(f"0 {uid} 1")
            with open("/proc/self/gid_map", "w") as f:
                f.write(f"0 {gid} 1")
        except OSError as e2:
            raise RunError(
                "cannot create a mount namespace: not root, and unprivileged user namespaces are not "
                f"allowed here ({e2.strerror}). Run as root (sudo mokka run ...) or enable them "
                "(sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces)"
            ) from None
    try:
        # Nothing mounted from here on may propagate back to the host.
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
    except OSError as e:
        raise RunError(f"cannot make the mount namespace private: {e.strerror}") from None


@dataclass
class Placer:
    """Binds simulated entries over host paths, shadowing parent directories where needed."""

    hide: dict[str, list[str]] = field(default_factory=dict)  # dir -> host names to hide (globs)
    shadowed: set[str] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)

    def shadow(self, directory: str) -> None:
        if directory in self.shadowed:
            return
        if directory in _NEVER_SHADOW:
            raise RunError(f"{directory}: will not shadow it; a path under it is missing on this host")
        if not os.path.isdir(directory):
            parent = os.path.dirname(directory)
            self.shadow(parent)
            os.mkdir(directory, 0o755)  # inside the parent's tmpfs: private to the namespace
            self.shadowed.add(directory)
            return
        fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
        try:
            names = os.listdir(f"/proc/self/fd/{fd}")
            _mount("tmpfs", directory, "tmpfs", MS_NOSUID, "mode=755")
            patterns = self.hide.get(directory, [])
            for name in names:
                if any(fnmatch.fnmatchcase(name, p) for p in patterns):
                    continue
                self._bring_back(fd, name, os.path.join(directory, name))
        finally:
            os.close(fd)
        self.shadowed.add(directory)

    def _bring_back(self, fd: int, name: str, target: str) -> None:
        try:
            st = os.lstat(name, dir_fd=fd)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(name, dir_fd=fd), target)
                return
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(target, 0o755)
            else:
                os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
            _mount(f"/proc/self/fd/{fd}/{name}", target, None, MS_BIND | MS_REC)
        except OSError as e:
            self.skipped.append(f"{target} ({e.strerror})")

    def place(self, source: str, target: str) -> None:
        """Bind `source` (in the mount) over `target` (a host path), creating it if needed."""
        is_dir = os.path.isdir(source)
        parent = os.path.dirname(target)
        hidden = any(fnmatch.fnmatchcase(os.path.basename(target), p) for p in self.hide.get(parent, []))
        if not (os.path.lexists(target) and os.path.isdir(target) == is_dir) or hidden:
            self.shadow(parent)
            if not os.path.lexists(target):
                if is_dir:
                    os.mkdir(target, 0o755)
                else:
                    os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
        _mount(source, target, None, MS_BIND | MS_REC)


def plan(root: str, live_root: str | None = None) -> tuple[list[tuple[str, str]], dict[str, list[str]]]:
    """(mount source, host target) pairs for the tree at `root`, and the host names to hide.
    `live_root` is the mount itself, for the entries computed at each read (/proc/modules: the
    host's modules plus the driver's), which the mirror at `root` does not hold."""
    live_root = live_root or root
    pairs: list[tuple[str, str]] = [(f"{root}/sys/bus/pci/devices", "/sys/bus/pci/devices")]
    for name in sorted(os.listdir(f"{root}/sys/bus/pci/drivers")):
        pairs.append((f"{root}/sys/bus/pci/drivers/{name}", f"/sys/bus/pci/drivers/{name}"))
    for name in sorted(os.listdir(f"{root}/sys/devices")):
        pairs.append((f"{root}/sys/devices/{name}", f"/sys/devices/{name}"))
    for name in sorted(os.listdir(f"{root}/sys/class")):
        pairs.append((f"{root}/sys/class/{name}", f"/sys/class/{name}"))
    for name in sorted(os.listdir(f"{root}/sys/module")):
        pairs.append((f"{root}/sys/module/{name}", f"/sys/module/{name}"))
    for name in sorted(os.listdir(f"{root}/proc/driver")):
        pairs.append((f"{root}/proc/driver/{name}", f"/proc/driver/{name}"))
    pairs.append((f"{root}/proc/devices", "/proc/devices"))
    pairs.append((f"{live_root}/proc/modules", PROC_MODULES))
    for name in sorted(os.listdir(f"{root}/dev")):
        pairs.append((f"{root}/dev/{name}", f"/dev/{name}"))
    hide = {
        "/sys/devices": ["pci*"],  # the host's PCI hierarchy gives way to the node's
        "/sys/class": ["infiniband*"],
        "/sys/module": ["nvidia*"],
        "/proc/driver": ["nvidia*"],
        "/dev": ["nvidia*", "infiniband"],
        "/sys/bus/pci/drivers": sorted(os.listdir(f"{root}/sys/bus/pci/drivers")),
    }
    return pairs, hide


def allocate(root: str, source: str, pairs: list[tuple[str, str]], spec: str) -> list[tuple[str, str]]:
    """`pairs` with the node's /dev/nvidia* entries cut down to what a workload given `spec`
    (`--gpus`: indexes, GPU and MIG UUIDs, `all`) gets from a container runtime: the common
    nodes, its GPUs' nodes, its MIG devices' capability nodes (mokkafs/cli/allocation.py). The shims
    then show exactly those devices (docs/containers.md)."""
    from mokkafs.cli.allocation import AllocationError, device_nodes, parse_info, parse_mig

    try:
        with open(f"{root}/node/gpu_count") as f:
            count = int(f.read())
        gpus = []
        for i in range(count):
            with open(f"{root}/gpu{i}/info") as f:
                gpu = parse_info(i, f.read())
            try:
                with open(f"{root}/gpu{i}/mig") as f:
                    gpu = Gpu(gpu.index, gpu.minor, gpu.uuid, parse_mig(f.read()))
            except OSError:
                pass  # a board without MIG
            gpus.append(gpu)
        names = device_nodes(gpus, spec)
    except AllocationError as e:
        raise RunError(str(e)) from None
    except (OSError, ValueError, KeyError) as e:
        raise RunError(f"{root}: cannot read the node's GPUs for --gpus: {e}") from None
    kept = [(s, t) for s, t in pairs if not os.path.basename(t).startswith("nvidia") or os.path.dirname(t) != "/dev"]
    return kept + [(f"{source}/dev/{name}", f"/dev/{name}") for name in names if os.path.lexists(f"{source}/dev/{name}")]


def tree_source(root: str) -> str:
    """Where to bind sys/, proc/ and dev/ from: the daemon's plain-directory mirror of them
    (mokkafs/daemon/mirror.py: the same trees, rewritten on every event, read at page-cache speed), or
    the mount itself where the daemon keeps none."""
    try:
        with open(f"{root}/node/state_dir") as f:
            mirror = os.path.join(f.read().strip(), "mirror")
    except OSError:
        return root
    return mirror if os.path.isdir(os.path.join(mirror, "sys")) else root


# What a consumer loads from the driver root by name: the sonames in usr/lib64 (libcuda.so is
# numba's and nvitop's first try) and usr/bin's nvidia-smi.
DRIVER_LIBS = (native.NVML_SONAME, native.CUDA_SONAME, "libcuda.so", native.UMAD_SONAME)
DRIVER_TOOLS = ("nvidia-smi",)


def _same_file(served: str, built: str) -> bool:
    try:
        return filecmp.cmp(served, built, shallow=False)
    except OSError:
        return False


def driver_dirs(root: str) -> tuple[str, str]:
    """(lib, bin): what CMD's LD_LIBRARY_PATH and PATH start with. The built shims' own
    directories (mokkafs/render/native.py) when the mount's driver root serves those very files:
    every program CMD starts searches LD_LIBRARY_PATH for each of its libraries (libc, ...) and
    PATH for its commands, and a miss in a plain directory costs a cached lookup, where a miss
    in the mount is a FUSE request. Otherwise (a daemon of another build, a shim it lacks) the
    mount's driver root itself, whose files are the ones the node serves."""
    lib, bin_ = f"{root}/driver/usr/lib64", f"{root}/driver/usr/bin"
    built_lib, built_bin = str(native.LIB_DIR), str(native.LIB_DIR.parent / "bin")
    pairs = [(f"{lib}/{n}", f"{built_lib}/{n}") for n in DRIVER_LIBS]
    pairs += [(f"{bin_}/{n}", f"{built_bin}/{n}") for n in DRIVER_TOOLS]
    for served, built in pairs:
        if os.path.lexists(served) and not _same_file(served, built):
            return lib, bin_
    return built_lib, built_bin


def environment(root: str, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    try:
        with open(f"{root}/node/state_dir") as f:
            env["MOKKA_STATE"] = os.path.join(f.read().strip(), "state")
        # The shims find the node by MOKKA_STATE wherever they are loaded from (docs/containers.md).
        lib, bin_ = driver_dirs(root)
    except OSError:
        # An older daemon: leave MOKKA_STATE as the caller set it; a shim loaded from the mount's
        # driver root finds the node through it (run/mokka).
        lib, bin_ = f"{root}/driver/usr/lib64", f"{root}/driver/usr/bin"
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [lib, base.get("LD_LIBRARY_PATH")]))
    env["PATH"] = ":".join(filter(None, [bin_, base.get("PATH", os.defpath)]))
    env["MOKKA_ROOT"] = root
    return env


def run(root: str, cmd: list[str], gpus: str | None = None) -> int:
    """Set up the namespace and exec CMD (never returns on success); returns an exit code on error."""
    if not cmd:
        print("mokka run: no command given (mokka run [--root MNT] -- CMD [ARGS])", file=sys.stderr)
        return 2
    # Resolve `root` before anything is mounted; it is a FUSE mount served by another process.
    root = os.path.abspath(root)
    try:
        with open(f"{root}/node/gpu_count") as f:
            f.read()
    except OSError as e:
        print(f"mokka run: {root}: not a mokkafs mount ({e.strerror}); start one with `mokka mount {root}`",
              file=sys.stderr)
        return 2
    source = tree_source(root)
    pairs, hide = plan(source, root)
    if gpus is not None:
        try:
            pairs = allocate(root, source, pairs, gpus)
        except RunError as e:
            print(f"mokka run: {e}", file=sys.stderr)
            return 2
    if not os.path.exists(PROC_MODULES):
        # No entry can be added to /proc, and /proc is never shadowed: on a kernel built without
        # loadable-module support there is nothing to cover.
        pairs.remove((f"{root}/proc/modules", PROC_MODULES))
        print(f"mokka run: warning: {PROC_MODULES}: this kernel has no module support, so there is none to "
              f"cover; the node's list is {root}/proc/modules", file=sys.stderr)
    cwd = os.getcwd()
    try:
        enter_namespace()
        placer = Placer(hide=hide)
        for source, target in pairs:
            placer.place(source, target)
    except RunError as e:
        print(f"mokka run: {e}", file=sys.stderr)
        return 126
    except OSError as e:
        print(f"mokka run: setting up the namespace failed: {e}", file=sys.stderr)
        return 126
    for skipped in placer.skipped:
        print(f"mokka run: warning: could not bring back {skipped}", file=sys.stderr)
    try:
        os.chdir(cwd)
    except OSError:
        os.chdir("/")
    env = environment(root, dict(os.environ))
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        print(f"mokka run: {cmd[0]}: {e.strerror}", file=sys.stderr)
        return 127 if e.errno == errno.ENOENT else 126


def main(argv: list[str] | None = None) -> int:
    """`python -m mokkafs.cli.run [--root MNT] -- CMD`: the same as `mokka run`, without the CLI's imports."""
    import argparse

    ap = argparse.ArgumentParser(prog="mokka run")
    ap.add_argument("--root", default="/mokka")
    ap.add_argument("--gpus")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    return run(args.root, cmd, args.gpus)


if __name__ == "__main__":
    sys.exit(main())
