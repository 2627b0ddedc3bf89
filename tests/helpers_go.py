"""NVIDIA's Go programs (and this repository's kubelet stand-in), as scripts/install_go_tools.sh
installs them from scripts/go-tools.txt: `go_tool(NAME)` is the program's path.

A program that is missing fails the test that wants it, naming the command that installs it: the
test script installs every line before pytest starts, so a missing one is a broken install, not a
reason to skip."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOLS_LIST = REPO / "scripts" / "go-tools.txt"


def go_cache() -> Path:
    return Path(os.environ.get("MOKKA_CACHE") or Path.home() / ".cache" / "mokkafs") / "go"


def pinned() -> dict[str, str]:
    """NAME -> PACKAGE@VERSION, as go-tools.txt pins them."""
    out = {}
    for line in TOOLS_LIST.read_text().splitlines():
        f = line.split()
        if f and not f[0].startswith("#"):
            out[f[0]] = f[1]
    return out


def go_tool(name: str) -> Path:
    """The installed program NAME (a line of scripts/go-tools.txt), built at its pinned version."""
    spec = pinned().get(name)
    if spec is None:
        raise KeyError(f"{name} is not a line of {TOOLS_LIST}")
    path = go_cache() / "bin" / name
    stamp = go_cache() / "stamps" / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"{name} ({spec}) is not installed at {path}: run scripts/install_go_tools.sh {name}")
    fields = stamp.read_text().split() if stamp.exists() else []
    if fields[:2] != [name, spec]:
        pytest.fail(f"{path} is not the pinned {spec} (stamp: {' '.join(fields[:2]) or 'none'}): "
                    f"run scripts/install_go_tools.sh {name}")
    return path


def module_source(name: str) -> Path:
    """The source tree, in the Go module cache, of the module line NAME of go-tools.txt builds from,
    at its pinned version: what NVIDIA's charts and images carry beside the program (CRDs,
    templates) is read from there, never copied into this repository."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import oci_image
    finally:
        sys.path.pop(0)
    go_tool(name)  # installed at its pin, or the test fails saying how to install it
    return oci_image.module_source(name)


def node_env(node) -> dict[str, str]:
    """A consumer's environment on `node` (a conftest MountedNode): its state, and NVML/libcuda from
    the mount's driver root, as `eval "$(mokka env)"` gives a shell."""
    env = dict(os.environ, MOKKA_STATE=str(node.state_dir / "state"))
    env["LD_LIBRARY_PATH"] = str(node.mnt / "driver/usr/lib64")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def parse_info(text: str) -> dict[str, str]:
    """The text of a gpuN/info file as a dict (name, index, minor, uuid, serial, bus_id, ...)."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


def node_info(node, gpu: int) -> dict[str, str]:
    """gpuN/info of a mounted node as a dict."""
    return parse_info(node.read(f"gpu{gpu}/info"))


def mig_parted_cmd(mnt: Path, *args: str) -> list[str]:
    """NVIDIA's mig-parted with `args`, as it runs on a node: under `mokka run` on the mount at
    `mnt` (its /proc/driver and /dev are the node's). mig-parted reads /proc/modules before anything
    else (IsNvidiaModuleLoaded) and stops without it; on a kernel without module support there is no
    such file and none can be added to a procfs, so the run goes through tests/with_proc_modules.sh,
    which gives it a /proc that is the kernel's plus the node's `proc/modules`."""
    from conftest import mokka_cmd

    cmd = [str(go_tool("nvidia-mig-parted")), *args]
    if not os.path.exists("/proc/modules"):
        cmd = [str(REPO / "tests" / "with_proc_modules.sh"), str(mnt / "proc/modules"), *cmd]
    return [*mokka_cmd(), "run", "--root", str(mnt), "--", *cmd]
