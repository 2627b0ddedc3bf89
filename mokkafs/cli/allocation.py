"""Which device nodes a workload given some of the node's GPUs gets, as a container runtime gives
them: `mokka run --gpus 0,2` and MIG UUIDs. Pure: parses the mount's gpuN/info and gpuN/mig texts."""
from __future__ import annotations

from dataclasses import dataclass

# What every allocation carries besides its GPUs (nvidia-ctk's common device nodes).
COMMON_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


class AllocationError(ValueError):
    """An entry that names nothing on this node; the message is for the user."""


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    gi_minor: int  # nvidia-caps minor of its GPU instance
    ci_minor: int  # nvidia-caps minor of its compute instance


@dataclass(frozen=True)
class Gpu:
    index: int
    minor: int
    uuid: str
    mig: tuple[MigDevice, ...] = ()


def parse_info(index: int, info: str) -> Gpu:
    """gpuN/info (`key: value` lines) and nothing of MIG yet."""
    fields = dict(line.split(": ", 1) for line in info.splitlines() if ": " in line)
    return Gpu(index=index, minor=int(fields["minor"]), uuid=fields["uuid"])


def parse_mig(text: str) -> tuple[MigDevice, ...]:
    """gpuN/mig: `gi ID ... minor M` lines, each followed by its `  ci ID ... minor M uuid U` lines."""
    out, gi_minor = [], None
    for line in text.splitlines():
        w = line.split()
        if line.startswith("gi "):
            gi_minor = int(w[w.index("minor") + 1])
        elif line.startswith("  ci ") and gi_minor is not None:
            out.append(MigDevice(uuid=w[w.index("uuid") + 1], gi_minor=gi_minor, ci_minor=int(w[w.index("minor") + 1])))
    return tuple(out)


def device_nodes(gpus: list[Gpu], spec: str) -> list[str]:
    """The names under /dev a workload given `spec` gets: the common nodes, `nvidia<minor>` of each
    GPU named (by index, `GPU-` UUID or `all`), and for a MIG device (by `MIG-` UUID) its GPU's node
    and `nvidia-caps/nvidia-cap<minor>` of its GPU and compute instances, as nvidia-ctk's spec
    gives a MIG device. Order: the common nodes, then each entry's, without repeats."""
    names: list[str] = list(COMMON_NODES)

    def add(name: str) -> None:
        if name not in names:
            names.append(name)

    entries = [e.strip() for e in spec.split(",")]
    if not spec.strip() or any(not e for e in entries):
        raise AllocationError(f"--gpus {spec!r}: a comma-separated list of GPU indexes, GPU or MIG UUIDs, or 'all'")
    for entry in entries:
        if entry == "all":
            for g in gpus:
                add(f"nvidia{g.minor}")
            continue
        gpu = next((g for g in gpus if entry.isdigit() and g.index == int(entry)), None)
        gpu = gpu or next((g for g in gpus if g.uuid.lower() == entry.lower()), None)
        if gpu is not None:
            add(f"nvidia{gpu.minor}")
            continue
        found = [(g, m) for g in gpus for m in g.mig if m.uuid.lower() == entry.lower()]
        if not found:
            raise AllocationError(f"--gpus: no GPU or MIG device {entry!r} on this node "
                                  f"(GPU indexes 0..{len(gpus) - 1}, GPU-/MIG- UUIDs, or 'all')")
        g, m = found[0]
        add(f"nvidia{g.minor}")
        add(f"nvidia-caps/nvidia-cap{m.gi_minor}")
        add(f"nvidia-caps/nvidia-cap{m.ci_minor}")
    return names
