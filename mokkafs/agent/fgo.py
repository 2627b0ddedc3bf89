"""A mokkafs node's profile in the shape run-ai's fake-gpu-operator reads its GPU profiles.

Pure: a profile and the mounted node's GPUs in, the ConfigMap out. The fake-gpu-operator
(github.com/run-ai/fake-gpu-operator) resolves a node pool's `gpu: {profile: NAME}` by reading
the ConfigMap `gpu-profile-NAME` in its own namespace, key `profile.yaml`
(internal/common/profile/profile.go `Load`, constants.go), and takes from that YAML the product
name, architecture and memory (`device_defaults`), the driver and CUDA versions (`system`), the
GPU count (`device_count`, else `len(devices)`) and each GPU's NUMA node (`pcie_topology`
root complexes holding the GPUs' bus ids; `Extract`, `DeviceCount`, `PCITopology`). Its chart
labels profile ConfigMaps `fake-gpu-operator/gpu-profile: "true"` (older releases:
`run.ai/gpu-profile: "true"`, templates/profiles/*.yaml). The rest of the document follows the
same file format (NVIDIA k8s-test-infra's mock NVML profiles, which the chart ships as its
built-in profiles), so a tool reading the full file finds the board's identity too.

One profile source for a mixed cluster: a node pool of fake nodes that names `gpu-profile-h100`
gets the same board a mokkafs node running `h100` simulates. docs/kubernetes.md shows the
topology entry.
"""
from __future__ import annotations

from dataclasses import dataclass

import yaml

from mokkafs.model.dynamics import framebuffer
from mokkafs.model.schema import GpuProfile, driver_branch

CM_NAME_PREFIX = "gpu-profile-"  # profile.CmNamePrefix
CM_PROFILE_KEY = "profile.yaml"  # profile.CmProfileKey
PROFILE_LABEL = "fake-gpu-operator/gpu-profile"  # profile.LabelGpuProfile
LEGACY_PROFILE_LABEL = "run.ai/gpu-profile"  # the chart's label before the rename
SOURCE_LABEL = "mokkafs.io/profile"  # ours: which mokkafs profile it was made from


@dataclass(frozen=True)
class FgoDevice:
    """One GPU of the mounted node, as its gpuN/info says."""

    index: int
    minor: int
    bus_id: str
    numa_node: int


def profile_name(profile: GpuProfile, gpus: int) -> str:
    """The name a node pool refers to: the mokkafs profile's, with the GPU count when the node
    has another count than the profile's own (so nodes of one profile but several sizes do not
    overwrite each other)."""
    return profile.name if gpus == profile.node.gpus else f"{profile.name}-x{gpus}"


def configmap_name(profile: GpuProfile, gpus: int) -> str:
    return CM_NAME_PREFIX + profile_name(profile, gpus)


def _major_minor(version: str) -> tuple[int, int]:
    major, _, minor = version.partition(".")
    return int(major), int(minor.split(".")[0] or 0)


def profile_document(profile: GpuProfile, devices: list[FgoDevice], driver_version: str, cuda_version: str) -> dict:
    """The `profile.yaml` mapping: the board (device_defaults), the node's driver (system), its
    GPUs (device_count, devices) and their NUMA placement (pcie_topology). Deterministic: two
    nodes of one profile and GPU count publish the same document (no UUIDs, no times)."""
    cc_major, cc_minor = _major_minor(profile.compute_capability)
    cuda_major, cuda_minor = _major_minor(cuda_version)
    mib = 1024 * 1024
    t = profile.thermal
    fb = framebuffer(profile, driver_branch(driver_version))  # as the node's NVML reports it
    defaults = {
        "name": profile.product_name,
        "brand": profile.product_brand.lower(),
        "architecture": profile.architecture.lower().replace(" ", "-"),  # GFD's gpu.family spelling
        "compute_capability": {"major": cc_major, "minor": cc_minor},
        "num_sms": profile.sm_count,
        "vbios_version": profile.vbios_version,
        "board_part_number": profile.board_part_number,
        "gpu_part_number": profile.gpu_part_number,
        "inforom": {"image_version": profile.inforom.image, "oem_object": profile.inforom.oem,
                    "ecc_object": profile.inforom.ecc, "pwr_object": profile.inforom.power},
        "memory": {"total_bytes": fb.total_mib * mib, "reserved_bytes": fb.reserved_mib * mib,
                   "memory_bus_width": profile.memory.bus_width_bits},
        "bar1_memory": {"total_bytes": profile.memory.bar1_mib * mib},
        "l2_cache_bytes": profile.l2_cache_bytes,
        "pci": {"device_id": (profile.pci.device_id << 16) | profile.pci.vendor_id,
                "subsystem_id": (profile.pci.subsystem_device_id << 16) | profile.pci.subsystem_vendor_id},
        "pcie": {"max_link_gen": profile.pci.max_link_gen, "max_link_width": profile.pci.max_link_width},
        "power": {"default_limit_mw": round(profile.power.default_limit_w * 1000),
                  "min_limit_mw": round(profile.power.min_limit_w * 1000),
                  "max_limit_mw": round(profile.power.max_limit_w * 1000)},
        "thermal": {"shutdown_threshold_c": t.shutdown_c, "slowdown_threshold_c": t.slowdown_c,
                    "max_operating_c": t.max_operating_c},
        "clocks": {"graphics_max": profile.clocks.max_graphics, "sm_max": profile.clocks.max_sm,
                   "memory_max": profile.clocks.max_mem, "video_max": profile.clocks.max_video,
                   "graphics_app_default": profile.clocks.default_app_graphics,
                   "memory_app_default": profile.clocks.default_app_mem},
        "ecc": {"mode_current": "enabled" if profile.memory.ecc else "disabled"},
        "mig": {"mode_current": "disabled" if profile.mig_capable else "N/A"},
        "fan": {"count": 1 if profile.has_fan else 0},
    }
    by_numa: dict[int, list[str]] = {}
    for d in devices:
        by_numa.setdefault(d.numa_node, []).append(d.bus_id)
    doc = {
        "version": "1.0",
        "system": {"driver_version": driver_version, "cuda_version": cuda_version,
                   "cuda_version_major": cuda_major, "cuda_version_minor": cuda_minor},
        "device_defaults": defaults,
        "device_count": len(devices),
        "devices": [{"index": d.index, "minor_number": d.minor, "pci": {"bus_id": d.bus_id}} for d in devices],
        "pcie_topology": {"root_complexes": [{"numa_node": n, "devices": bdfs} for n, bdfs in sorted(by_numa.items())]},
    }
    if profile.nvlink.links:
        doc["nvlink"] = {"version": profile.nvlink.version, "links_per_gpu": profile.nvlink.links,
                         "bandwidth_per_link_gbps": profile.nvlink.link_speed_gbps}
    return doc


def configmap(profile: GpuProfile, devices: list[FgoDevice], driver_version: str, cuda_version: str,
              namespace: str) -> dict:
    """The ConfigMap object (a v1 ConfigMap as the API takes it)."""
    doc = profile_document(profile, devices, driver_version, cuda_version)
    header = (f"# {profile.product_name} x{len(devices)}: mokkafs profile {profile.name} (profiles/{profile.name}.yaml,\n"
              f"# sources in mokkafs docs/profiles.md), published by `mokka agent` for fake-gpu-operator.\n")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(profile, len(devices)),
            "namespace": namespace,
            "labels": {PROFILE_LABEL: "true", LEGACY_PROFILE_LABEL: "true", SOURCE_LABEL: profile.name,
                       "app.kubernetes.io/managed-by": "mokkafs"},
        },
        "data": {CM_PROFILE_KEY: header + yaml.safe_dump(doc, sort_keys=False, width=120)},
    }


def same_content(current: dict, wanted: dict) -> bool:
    """Whether a ConfigMap read back already holds what would be written (its data and our labels)."""
    labels = (current.get("metadata") or {}).get("labels") or {}
    return current.get("data") == wanted["data"] and all(labels.get(k) == v for k, v in wanted["metadata"]["labels"].items())
