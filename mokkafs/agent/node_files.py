"""What the agent writes for the node's other consumers, as text: a CDI spec for container
runtimes and a Node Feature Discovery feature file. Pure: the watch loop writes them."""
from __future__ import annotations

import posixpath
from dataclasses import dataclass

import yaml

from mokkafs.render.native import CDI_HOOK

CDI_VERSION = "0.5.0"  # what nvidia-ctk writes when device nodes carry a hostPath


@dataclass(frozen=True)
class GpuDevice:
    index: int
    minor: int
    uuid: str


class _IndentedDumper(yaml.SafeDumper):
    """Sequences indented under their key, as Go's yaml.v3 (and so nvidia-ctk) writes them
    (nvidia-ctk indents by 4; this by 2, the same document)."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)

    def ignore_aliases(self, data):  # devices share their edits; a spec has no YAML anchors
        return True


def _lib_dir(machine: str) -> str:
    return {"aarch64": "/usr/lib/aarch64-linux-gnu", "arm64": "/usr/lib/aarch64-linux-gnu"}.get(
        machine, "/usr/lib/x86_64-linux-gnu"
    )


CDI_STATE_DIR = "/run/mokka"  # where a CDI container sees the state directory (read-only)


def cdi_spec(mount: str, state_file: str, gpus: list[GpuDevice], driver_files: list[str], machine: str,
             kind: str = "nvidia.com/gpu", proc_hook: bool = False, mig_monitor: str | None = None) -> str:
    """nvidia.com/gpu devices named by index and UUID (nvidia-ctk's default `index,uuid`
    strategy) and `all`. Device nodes come from the mount's dev/ (the runtime reads type, major
    and minor from hostPath); the driver files present in `<mount>/driver` and the state file's
    directory are bind-mounted, so `nvidia-smi`, NVML and CUDA work in the container without the
    NVIDIA runtime. The directory, not the file: CUDA processes reach the process table and its
    descriptor socket beside the state file, and survive the daemon replacing either.
    `proc_hook`: the mount's driver root has mokka-cdi-hook, which the spec runs as a
    createContainer hook to bind the node's proc/driver and proc/devices over the container's, where a
    real node's kernel shows /proc/driver/nvidia, nvidia-caps and its devices' majors (no mount entry
    may target /proc).
    `mig_monitor`: the MIG monitor capability's node under dev/ (`nvidia-caps/nvidia-cap2`), which
    `all` carries: a container given every GPU sees every MIG device on them, those made later
    too, as NVIDIA's runtime gives NVIDIA_MIG_MONITOR_DEVICES=all (the device plugin's and GPU
    feature discovery's containers under the NVIDIA runtime class)."""
    dev = f"{mount}/dev"

    def node(name: str) -> dict:
        return {"path": f"/dev/{name}", "hostPath": f"{dev}/{name}"}

    devices = []
    for g in gpus:
        edits = {"deviceNodes": [node(f"nvidia{g.minor}")]}
        devices.append({"name": str(g.index), "containerEdits": edits})
        devices.append({"name": g.uuid, "containerEdits": edits})
    every = [node(f"nvidia{g.minor}") for g in gpus] + ([node(mig_monitor)] if mig_monitor else [])
    devices.append({"name": "all", "containerEdits": {"deviceNodes": every}})
    state_dir, state_name = posixpath.split(state_file)
    mounts = [{"hostPath": state_dir, "containerPath": CDI_STATE_DIR, "options": ["ro", "nosuid", "nodev", "bind"]}]
    for rel in driver_files:  # e.g. usr/lib64/libnvidia-ml.so.1, usr/bin/nvidia-smi
        name = rel.rsplit("/", 1)[-1]
        target = f"/usr/bin/{name}" if "/bin/" in f"/{rel}" else f"{_lib_dir(machine)}/{name}"
        mounts.append(
            {"hostPath": f"{mount}/driver/{rel}", "containerPath": target, "options": ["ro", "nosuid", "nodev", "bind"]}
        )
    edits: dict = {
        "env": ["NVIDIA_VISIBLE_DEVICES=void", f"MOKKA_STATE={CDI_STATE_DIR}/{state_name}"],
        "deviceNodes": [node("nvidiactl"), node("nvidia-uvm"), node("nvidia-uvm-tools")],
        "mounts": mounts,
    }
    if proc_hook:
        edits["hooks"] = [{"hookName": "createContainer", "path": f"{mount}/driver/usr/bin/{CDI_HOOK}",
                           "args": [CDI_HOOK, "proc", f"{mount}/proc"]}]
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": kind,  # vendor/class: another one lets a test's spec sit beside the node's
        "devices": devices,
        "containerEdits": edits,
    }
    body = yaml.dump(spec, Dumper=_IndentedDumper, indent=2, sort_keys=False, default_flow_style=False)
    return "---\n" + body


def nfd_features(profile: str, gpu_count: int, driver_version: str) -> str:
    """NFD's local source reads `name=value` lines from features.d/. Un-prefixed names become
    feature.node.kubernetes.io/<name>; pci-10de.present is what the GPU Operator and the device
    plugin's chart select on. nvidia.com/ names need NFD's extraLabelNs to include nvidia.com."""
    lines = [
        "pci-10de.present=true",
        "nvidia.com/gpu.present=true",
        f"mokkafs.profile={profile}",
        f"mokkafs.gpus={gpu_count}",
        f"mokkafs.driver-version={driver_version}",
    ]
    return "".join(f"{line}\n" for line in lines)


DRIVER_FILES = (
    "usr/lib64/libnvidia-ml.so.1",
    "usr/lib64/libcuda.so.1",
    "usr/bin/nvidia-smi",
)
