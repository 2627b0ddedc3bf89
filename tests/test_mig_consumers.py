"""Real MIG consumers' NVML call sequences, replayed call by call against our libnvidia-ml.so.1 on a
mounted node, and what each consumer derives from the answers (level 4; docs/mig.md, "Consumers").

NVIDIA's MIG consumers are Go programs, and Go binaries cannot be built here. Each replay below
follows one consumer's source (named in its docstring: repository, path, the calls it makes) with
pynvml, which calls the same C functions go-nvml does, in the same order and with the same
arguments, and treats each answer the way that Go code does: which errors it skips, which end it,
what it computes from the values. The functions run in a process of their own (`replay`), whose
NVML is the node's; the tests set a layout and assert what the consumer would advertise.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import mount_env

pytestmark = pytest.mark.level("shims")

pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")

HERE = Path(__file__).resolve().parent
H100 = "NVIDIA H100 80GB HBM3"


def replay(node, name: str, *args) -> object:
    """This module's `name`(*args) in a process whose NVML is the node's; its result, through JSON."""
    code = (f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import test_mig_consumers as t; "
            f"print(json.dumps(t.{name}(*{args!r})))")
    r = subprocess.run([sys.executable, "-c", code], env=mount_env(node), capture_output=True, text=True,
                       timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def layout(node, gpu: int, *args: str) -> None:
    assert node.cli("inject", "--root", str(node.mnt), str(gpu), "mig", *args).returncode == 0


def nvml():
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def _value(x):
    return getattr(x, "value", x)  # pynvml returns some counts as c_uint


def _text(x) -> str:
    return x.decode() if isinstance(x, bytes) else x


# ---- go-nvlib: the MIG helpers the device plugin, GFD and the DRA driver share -----------------


def go_nvlib_mig_enabled(n, h) -> bool:
    """NVIDIA/go-nvlib pkg/nvlib/device/device.go, IsMigCapable/IsMigEnabled: nvmlDeviceGetMigMode;
    NOT_SUPPORTED is "not capable", any other error ends the walk."""
    try:
        current, _pending = n.nvmlDeviceGetMigMode(h)
    except n.NVMLError as e:
        if e.value == n.NVML_ERROR_NOT_SUPPORTED:
            return False
        raise
    return current == n.NVML_DEVICE_MIG_ENABLE


def go_nvlib_mig_capable(n, h) -> bool:
    try:
        n.nvmlDeviceGetMigMode(h)
    except n.NVMLError as e:
        if e.value == n.NVML_ERROR_NOT_SUPPORTED:
            return False
        raise
    return True


def go_nvlib_visit_mig_devices(n, h) -> list:
    """device.go, VisitMigDevices: MIG capable, then nvmlDeviceGetMaxMigDeviceCount and
    nvmlDeviceGetMigDeviceHandleByIndex for every index below it, skipping NOT_FOUND and
    INVALID_ARGUMENT; mig_device.go, NewMigDevice: nvmlDeviceIsMigDeviceHandle must say so."""
    if not go_nvlib_mig_capable(n, h):
        return []
    migs = []
    for i in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        except n.NVMLError as e:
            if e.value in (n.NVML_ERROR_NOT_FOUND, n.NVML_ERROR_INVALID_ARGUMENT):
                continue
            raise
        assert n.nvmlDeviceIsMigDeviceHandle(m), "not a MIG device"
        migs.append((i, m))
    return migs


def gi_profiles(n, h):
    """(index, nvmlDeviceGetGpuInstanceProfileInfo) for every GPU instance profile index below
    NVML_GPU_INSTANCE_PROFILE_COUNT the GPU answers: go-nvlib, mig-parted and the DRA driver
    each loop this way, skipping NOT_SUPPORTED and INVALID_ARGUMENT and stopping at any other
    error. go-nvml's GetGpuInstanceProfileInfo is the unversioned C call (pynvml's version=1;
    pynvml's default is the versioned one), which answers with MIG off too (docs/mig.md)."""
    for i in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            yield i, n.nvmlDeviceGetGpuInstanceProfileInfo(h, i, 1)
        except n.NVMLError as e:
            if e.value not in (n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_INVALID_ARGUMENT):
                raise


def ci_profiles(n, gi):
    """(j, k, nvmlGpuInstanceGetComputeInstanceProfileInfo) for every compute profile j and
    engine profile k of GPU instance gi, skipped and stopped the same way."""
    for j in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        for k in range(n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT):
            try:
                yield j, k, n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, j, k)
            except n.NVMLError as e:
                if e.value not in (n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_INVALID_ARGUMENT):
                    raise


# NVIDIA/go-nvlib pkg/nvlib/device/mig_profile.go, NewMigProfile: slices by profile id ("+me" for REV1).
GI_SLICES = {0: 1, 7: 1, 9: 1, 1: 2, 8: 2, 2: 3, 3: 4, 6: 6, 4: 7, 5: 8}
CI_SLICES = {0: 1, 7: 1, 1: 2, 2: 3, 3: 4, 6: 6, 4: 7, 5: 8}


def go_nvlib_mig_memory_gb(total_bytes: int, mig_mb: int) -> int:
    """mig_profile.go, getMigMemorySizeGB: the slice's share of the GPU in eighths, times its GB."""
    fraction = math.ceil(mig_mb * 1024 * 1024 / total_bytes * 8) / 8
    total_gb = (total_bytes + (1 << 30) - 1) >> 30
    return int(math.floor(fraction * total_gb + 0.5))  # Go's math.Round: half away from zero


def go_nvlib_profile(gi_index: int, ci_index: int, mig_mb: int, total_bytes: int) -> dict:
    """mig_profile.go, NewMigProfile and String: "1g.10gb", "1c.3g.40gb", "1g.10gb+me"."""
    g, c = GI_SLICES[gi_index], CI_SLICES[ci_index]
    gb = go_nvlib_mig_memory_gb(total_bytes, mig_mb)
    suffix = "+me" if gi_index in (7, 8) else ""
    name = f"{g}g.{gb}gb{suffix}" if c == g else f"{c}c.{g}g.{gb}gb{suffix}"
    return dict(C=c, G=g, GB=gb, gi=gi_index, ci=ci_index, name=name)


def go_nvlib_mig_profile_of(n, m) -> dict:
    """mig_device.go, GetProfile: the parent (nvmlDeviceGetDeviceHandleFromMigDeviceHandle), its
    memory, the MIG device's attributes and instance ids, the GPU and compute instance by id and
    their info, then every GPU instance profile index until one's id is the instance's, and every
    compute profile (j, k) of that instance until one's id is the compute instance's."""
    parent = n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
    total = n.nvmlDeviceGetMemoryInfo(parent).total
    attributes = n.nvmlDeviceGetAttributes(m)
    gi = n.nvmlDeviceGetGpuInstanceById(parent, n.nvmlDeviceGetGpuInstanceId(m))
    ci = n.nvmlGpuInstanceGetComputeInstanceById(gi, n.nvmlDeviceGetComputeInstanceId(m))
    gi_info, ci_info = n.nvmlGpuInstanceGetInfo(gi), n.nvmlComputeInstanceGetInfo(ci)
    for i, gi_profile in gi_profiles(n, parent):
        if gi_profile.id != gi_info.profileId:
            continue
        for j, _k, ci_profile in ci_profiles(n, gi):
            if ci_profile.id == ci_info.profileId:
                return go_nvlib_profile(i, j, attributes.memorySizeMB, total)
    raise AssertionError("no matching profile IDs found")


def go_nvlib_visit_mig_profiles(n, h) -> list[dict]:
    """device.go, VisitMigProfiles: every GPU instance profile index the GPU answers (skipping
    NOT_SUPPORTED and INVALID_ARGUMENT), with every compute profile index, weeded heuristically."""
    if not go_nvlib_mig_capable(n, h):
        return []
    total = n.nvmlDeviceGetMemoryInfo(h).total
    out = []
    for i, info in gi_profiles(n, h):
        for j in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            p = go_nvlib_profile(i, j, info.memorySizeMB, total) if j in CI_SLICES else None
            if p is None or p["C"] > p["G"] or (p["C"] < p["G"] and p["C"] * 2 > p["G"] + 1):
                continue
            out.append(p)
    return out


def gpus(n) -> list:
    return [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]


# ---- NVIDIA's device plugin -------------------------------------------------------------------


def _mig_minors(root: str) -> dict[str, str]:
    """NVIDIA/k8s-device-plugin internal/mig/mig-dp.go, GetMigCapabilityDevicePaths:
    /proc/driver/nvidia-caps/mig-minors, each line's capability path to /dev/nvidia-caps/nvidia-capN."""
    paths = {}
    for line in Path(root, "proc/driver/nvidia-caps/mig-minors").read_text().splitlines():
        key, minor = line.split()
        if key.startswith("gpu"):
            gpu, rest = key.split("/", 1)
            key = f"{gpu}/mig/{rest}"
        else:
            key = f"mig/{key}"
        paths[f"/proc/driver/nvidia/capabilities/{key}"] = f"/dev/nvidia-caps/nvidia-cap{minor}"
    return paths


def device_plugin(strategy: str, root: str) -> dict:
    """NVIDIA/k8s-device-plugin: the resources it would advertise under a MIG strategy, or the
    error it stops with.

    - internal/rm/rm.go, AddDefaultResourcesToConfig: `nvidia.com/gpu` for every full GPU;
      `single`: every MIG device is `nvidia.com/gpu` too; `mixed`: one resource
      `nvidia.com/mig-<profile>` (`+` as `.`) per profile go-nvlib's VisitMigProfiles finds with
      C == G.
    - internal/rm/device_map.go, buildDeviceMapFromConfigResources: full GPUs (VisitDevices:
      nvmlDeviceGetName, IsMigEnabled; a MIG-enabled GPU is skipped), MIG devices (VisitMigDevices,
      GetProfile matched against the patterns), then assertAllMigDevicesAreValid: every MIG-enabled
      GPU has a MIG device, and under `single` every MIG device's nvmlDeviceGetAttributes is the
      same; under `single` full GPUs and MIG devices together are refused.
    - internal/rm/nvml_devices.go: a device's id is its UUID (nvmlDeviceGetUUID), its index "i"
      or "i:j"; a MIG device's paths (GetPaths) are /dev/nvidia<parent minor> and the nodes of its
      gi and ci capabilities, each of which must be in mig-minors.
    """
    n = nvml()
    patterns = [("*", "nvidia.com/gpu")]
    if strategy == "single":
        mig_patterns = [("*", "nvidia.com/gpu")]
    else:
        mig_patterns = []
        for h in gpus(n):
            for p in go_nvlib_visit_mig_profiles(n, h):
                if p["C"] == p["G"] and (p["name"], "nvidia.com/mig-" + p["name"].replace("+", ".")) not in mig_patterns:
                    mig_patterns.append((p["name"], "nvidia.com/mig-" + p["name"].replace("+", ".")))

    def matches(pattern: str, name: str) -> bool:
        return pattern == "*" or pattern == name

    full, migs = {}, {}
    for i, h in enumerate(gpus(n)):
        name = _text(n.nvmlDeviceGetName(h))
        if go_nvlib_mig_enabled(n, h):
            continue
        resource = next(r for p, r in patterns if matches(p, name))
        full.setdefault(resource, []).append(dict(index=str(i), id=_text(n.nvmlDeviceGetUUID(h)),
                                                  paths=[f"/dev/nvidia{n.nvmlDeviceGetMinorNumber(h)}"]))
    caps = _mig_minors(root)
    for i, h in enumerate(gpus(n)):
        for j, m in go_nvlib_visit_mig_devices(n, h):
            profile = go_nvlib_mig_profile_of(n, m)["name"]
            resource = next((r for p, r in mig_patterns if matches(p, profile)), None)
            if resource is None:
                return dict(error=f"MIG profile '{profile}' does not match any resource patterns")
            gi, ci = n.nvmlDeviceGetGpuInstanceId(m), n.nvmlDeviceGetComputeInstanceId(m)
            minor = n.nvmlDeviceGetMinorNumber(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m))
            gi_cap = f"/proc/driver/nvidia/capabilities/gpu{minor}/mig/gi{gi}/access"
            ci_cap = f"/proc/driver/nvidia/capabilities/gpu{minor}/mig/gi{gi}/ci{ci}/access"
            if gi_cap not in caps or ci_cap not in caps:
                return dict(error=f"missing MIG GPU instance capability path: {gi_cap}")
            migs.setdefault(resource, []).append(dict(index=f"{i}:{j}", id=_text(n.nvmlDeviceGetUUID(m)),
                                                      paths=[f"/dev/nvidia{minor}", caps[gi_cap], caps[ci_cap]]))
    for h in gpus(n):
        if go_nvlib_mig_enabled(n, h) and not go_nvlib_visit_mig_devices(n, h):
            return dict(error="invalid MIG configuration: at least one device with migEnabled=true was not "
                              "configured correctly: device 0 has an invalid MIG configuration")
    if strategy == "single":
        previous = None
        for h in gpus(n):
            for _j, m in go_nvlib_visit_mig_devices(n, h):
                a = n.nvmlDeviceGetAttributes(m)
                attrs = tuple(getattr(a, f) for f, _t in a._fields_)
                if previous is not None and attrs != previous:
                    return dict(error="invalid MIG configuration: more than one MIG device type present on node")
                previous = attrs
        if full and migs:
            return dict(error="all devices on the node must be configured with the same migEnabled value")
    for resource, devices in migs.items():
        full.setdefault(resource, []).extend(devices)
    return dict(resources=full, mig_patterns=[r for _p, r in mig_patterns])


def device_plugin_health(root: str, injections: list[list]) -> list:
    """NVIDIA/k8s-device-plugin internal/rm/health.go, registerDevices and runEventMonitor: each
    advertised device's placement (a MIG device: nvmlDeviceGetHandleByUUID of its MIG- UUID,
    nvmlDeviceGetDeviceHandleFromMigDeviceHandle, the parent's UUID, nvmlDeviceGetGpuInstanceId
    and ComputeInstanceId), kept in a map keyed by the parent's UUID (so one device per GPU: the
    last one registered), and nvmlDeviceGetSupportedEventTypes / nvmlDeviceRegisterEvents on the
    parent; then for each event (nvmlEventSetWait_v2): an Xid critical error not ignored, the
    device of its GPU's UUID, and for a MIG device an event naming an instance must name its own.
    `injections`: (gpu, Xid line for gpuN/inject_xid); the devices each one marks unhealthy."""
    n = nvml()
    ignored = {13, 31, 43, 45, 68, 109}
    parent_to_device, gi_of, ci_of = {}, {}, {}
    event_set = n.nvmlEventSetCreate()
    mask = n.nvmlEventTypeXidCriticalError | n.nvmlEventTypeDoubleBitEccError | n.nvmlEventTypeSingleBitEccError
    for h in gpus(n):
        for _j, m in go_nvlib_visit_mig_devices(n, h):
            uuid = _text(n.nvmlDeviceGetUUID(m))
            mig = n.nvmlDeviceGetHandleByUUID(uuid)
            parent = _text(n.nvmlDeviceGetUUID(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)))
            gi_of[uuid], ci_of[uuid] = n.nvmlDeviceGetGpuInstanceId(mig), n.nvmlDeviceGetComputeInstanceId(mig)
            parent_to_device[parent] = uuid
            gpu = n.nvmlDeviceGetHandleByUUID(parent)
            n.nvmlDeviceRegisterEvents(gpu, mask & n.nvmlDeviceGetSupportedEventTypes(gpu), event_set)
    out = []
    for gpu, line in injections:
        Path(root, f"gpu{gpu}/inject_xid").write_text(line)
        e = n.nvmlEventSetWait_v2(event_set, 5000)
        unhealthy = []
        if e.eventType == n.nvmlEventTypeXidCriticalError and e.eventData not in ignored:
            device = parent_to_device.get(_text(n.nvmlDeviceGetUUID(e.device)))
            named = e.gpuInstanceId != 0xFFFFFFFF and e.computeInstanceId != 0xFFFFFFFF
            if device and (not named or (gi_of[device], ci_of[device]) == (e.gpuInstanceId, e.computeInstanceId)):
                unhealthy.append(device)
        out.append(dict(xid=e.eventData, gi=e.gpuInstanceId, ci=e.computeInstanceId, unhealthy=unhealthy))
    n.nvmlEventSetFree(event_set)
    return out


# ---- GPU feature discovery --------------------------------------------------------------------


def gpu_feature_discovery(strategy: str) -> dict:
    """GPU feature discovery's MIG labels, now in NVIDIA/k8s-device-plugin internal/lm.

    - nvml.go, newMigCapabilityLabeler: `nvidia.com/mig.capable`, any GPU's IsMigCapable.
    - mig-strategy.go: `nvidia.com/mig.strategy`; newGPULabelers: one resource labeler per GPU
      name (MIG-enabled ones without sharing, replicas 0); newMigStrategySingleLabeler: no
      MIG-enabled GPU is `none`; an empty MIG-enabled GPU, a mix of MIG-enabled and disabled GPUs,
      or more than one profile name gives the `-MIG-INVALID` product with count, replicas and
      memory 0; else `nvidia.com/gpu` labels the MIG devices; newMigStrategyMixedLabeler:
      `nvidia.com/mig-<profile>` per profile name. Later labelers overwrite earlier ones (list.go).
    - resource.go, NewMIGResourceLabeler: product `<parent name>-MIG-<profile>` (spaces as `-`),
      count, replicas (1: sharing on but not replicated), and newMigAttributeLabels from
      internal/resource/nvml-mig-device.go, GetAttributes: memory, multiprocessors, slices.gi,
      slices.ci, engines.copy/decoder/encoder/jpeg/ofa from nvmlDeviceGetAttributes; a MIG
      device's name is its go-nvlib profile with `+` as `.`.
    - resource.go, NewGPUResourceLabeler: product, count, replicas, memory (total MiB),
      family and compute.major/minor from nvmlDeviceGetCudaComputeCapability.
    """
    n = nvml()
    labels = {"nvidia.com/mig.capable": str(any(go_nvlib_mig_capable(n, h) for h in gpus(n))).lower()}

    def product(*parts: str) -> str:
        return "-".join(p.replace(" ", "-") for p in parts if p)

    def gpu_labels(h, count: int, replicas: int, prefix: str = "nvidia.com/gpu") -> dict:
        major, minor = n.nvmlDeviceGetCudaComputeCapability(h)
        family = {8: "ampere", 9: "hopper"}.get(major, "undefined")
        return {f"{prefix}.product": product(_text(n.nvmlDeviceGetName(h))), f"{prefix}.count": str(count),
                f"{prefix}.replicas": str(replicas), f"{prefix}.memory": str(n.nvmlDeviceGetMemoryInfo(h).total >> 20),
                f"{prefix}.family": family, f"{prefix}.compute.major": str(major), f"{prefix}.compute.minor": str(minor)}

    by_name: dict[str, list] = {}
    enabled = [h for h in gpus(n) if go_nvlib_mig_enabled(n, h)]
    disabled = [h for h in gpus(n) if not go_nvlib_mig_enabled(n, h)]
    for h in enabled + disabled:
        by_name.setdefault(_text(n.nvmlDeviceGetName(h)), []).append(h)
    for h in enabled:
        labels.update(gpu_labels(h, len(by_name[_text(n.nvmlDeviceGetName(h))]), 0))
    for h in disabled:
        labels.update(gpu_labels(h, len(by_name[_text(n.nvmlDeviceGetName(h))]), 1))
    if strategy == "none":
        return labels
    labels["nvidia.com/mig.strategy"] = strategy

    def mig_resources(resource_of) -> dict:
        resources: dict[str, list] = {}
        for h in enabled:
            for _j, m in go_nvlib_visit_mig_devices(n, h):
                name = go_nvlib_mig_profile_of(n, m)["name"].replace("+", ".")
                resources.setdefault(name, [resource_of(name), m, 0])[2] += 1
        return resources

    def invalid(reason: str) -> dict:
        parent = _text(n.nvmlDeviceGetName(enabled[0]))
        labels.update({"nvidia.com/gpu.product": product(parent, "MIG", "INVALID"), "nvidia.com/gpu.count": "0",
                       "nvidia.com/gpu.replicas": "0", "nvidia.com/gpu.memory": "0"})
        return labels

    if strategy == "single":
        if not enabled:
            return labels
        if any(not go_nvlib_visit_mig_devices(n, h) for h in enabled):
            return invalid("at least one MIG device is enabled but empty")
        if disabled:
            return invalid("devices with MIG enabled and disable detected")
        resources = mig_resources(lambda name: "nvidia.com/gpu")
        if len(resources) != 1:
            return invalid("more than one MIG device type present on node")
    else:
        resources = mig_resources(lambda name: "nvidia.com/mig-" + name)
    for name, (resource, m, count) in resources.items():
        a = n.nvmlDeviceGetAttributes(m)
        parent = _text(n.nvmlDeviceGetName(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)))
        labels.update({f"{resource}.product": product(parent, "MIG", name), f"{resource}.count": str(count),
                       f"{resource}.replicas": "1", f"{resource}.memory": str(a.memorySizeMB),
                       f"{resource}.multiprocessors": str(a.multiprocessorCount),
                       f"{resource}.slices.gi": str(a.gpuInstanceSliceCount),
                       f"{resource}.slices.ci": str(a.computeInstanceSliceCount),
                       f"{resource}.engines.copy": str(a.sharedCopyEngineCount),
                       f"{resource}.engines.decoder": str(a.sharedDecoderCount),
                       f"{resource}.engines.encoder": str(a.sharedEncoderCount),
                       f"{resource}.engines.jpeg": str(a.sharedJpegCount),
                       f"{resource}.engines.ofa": str(a.sharedOfaCount)})
    return labels


# ---- mig-parted -------------------------------------------------------------------------------


def mig_parted_walk(n, h, visit) -> None:
    """NVIDIA/mig-parted internal/nvlib/mig/mig.go, WalkGpuInstances and WalkComputeInstances:
    every GPU instance profile index (nvmlDeviceGetGpuInstanceProfileInfo, skipping NOT_SUPPORTED
    and INVALID_ARGUMENT), its instances (nvmlDeviceGetGpuInstances, a buffer of the profile's
    instanceCount), and in each every compute profile (j, k) and its compute instances."""
    for i, gi_profile in gi_profiles(n, h):
        buf = (n.c_nvmlGpuInstance_t * gi_profile.instanceCount)()
        count = n.c_uint(gi_profile.instanceCount)
        n.nvmlDeviceGetGpuInstances(h, gi_profile.id, buf, n.byref(count))
        for gi in list(buf[:count.value]):
            cis = []
            for j, k, ci_profile in ci_profiles(n, gi):
                cbuf = (n.c_nvmlComputeInstance_t * ci_profile.instanceCount)()
                ccount = n.c_uint(ci_profile.instanceCount)
                n.nvmlGpuInstanceGetComputeInstances(gi, ci_profile.id, cbuf, n.byref(ccount))
                cis += [(ci, j, k, ci_profile) for ci in cbuf[:ccount.value]]
            visit(gi, i, gi_profile, cis)


def _mig_parted_profile(n, h, i, j, gi_profile, ci_profile) -> str:
    """NVIDIA/mig-parted pkg/types/mig_profile.go, NewMigProfile and String: C and G from the
    profile infos' sliceCount, GB from the GPU instance profile's memory and the GPU's."""
    total = n.nvmlDeviceGetMemoryInfo(h).total
    c, g = ci_profile.sliceCount, gi_profile.sliceCount
    gb = go_nvlib_mig_memory_gb(total, gi_profile.memorySizeMB)
    suffix = "+me" if i == n.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 else ""
    return (f"{g}g.{gb}gb" if c == g else f"{c}c.{g}g.{gb}gb") + suffix


def mig_parted_get_config(n, h) -> dict[str, int]:
    """pkg/mig/config/config.go, GetMigConfig: AssertMigEnabled (nvmlDeviceGetMigMode), then the
    walk, counting each compute instance's profile."""
    assert go_nvlib_mig_enabled(n, h), "MIG mode disabled"
    config: dict[str, int] = {}

    def visit(gi, i, gi_profile, cis):
        for _ci, j, _k, ci_profile in cis:
            name = _mig_parted_profile(n, h, i, j, gi_profile, ci_profile)
            config[name] = config.get(name, 0) + 1

    mig_parted_walk(n, h, visit)
    return config


def mig_parted_apply(gpu: int, wanted: dict[str, int]) -> dict:
    """NVIDIA/mig-parted `apply`: the mode first (pkg/mig/mode/nvml.go: nvmlDeviceGetMigMode,
    nvmlDeviceSetMigMode, then IsMigModeChangePending, current != pending), then the layout
    (pkg/mig/config/config.go, SetMigConfig): clear what is there (ClearMigConfig: the walk,
    nvmlComputeInstanceDestroy on each compute instance, then nvmlGpuInstanceDestroy), then for
    each profile of the config flattened largest first (pkg/types/mig_config.go, Flatten):
    nvmlDeviceGetGpuInstanceProfileInfo of the profile's index (ParseMigProfile: "1g" is
    NVML_GPU_INSTANCE_PROFILE_1_SLICE, "+me" REV1), nvmlDeviceCreateGpuInstance (reusing the last
    GPU instance when the profile repeats, and making a new one when its compute instance cannot
    be made there), nvmlGpuInstanceGetComputeInstanceProfileInfo,
    nvmlGpuInstanceCreateComputeInstance, and the check that the profile made is the one asked
    for (NewMigProfile from the two profile infos). `assert` then compares GetMigConfig."""
    n = nvml()
    h = n.nvmlDeviceGetHandleByIndex(gpu)
    steps = []
    if not go_nvlib_mig_enabled(n, h):
        steps.append(["set_mode", _value(n.nvmlDeviceSetMigMode(h, n.NVML_DEVICE_MIG_ENABLE))])
    current, pending = n.nvmlDeviceGetMigMode(h)
    steps.append(["pending", current != pending])

    def clear(gi, _i, _gi_profile, cis):
        for ci, *_rest in cis:
            n.nvmlComputeInstanceDestroy(ci)
        n.nvmlGpuInstanceDestroy(gi)

    mig_parted_walk(n, h, clear)
    steps.append(["cleared", mig_parted_get_config(n, h)])
    gi_index = {1: n.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 2: n.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
                3: n.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 4: n.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
                7: n.NVML_GPU_INSTANCE_PROFILE_7_SLICE}
    ci_index = {1: n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: n.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
                3: n.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: n.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
                7: n.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE}
    flat = sorted((p for p, k in wanted.items() for _ in range(k)), key=lambda p: -int(p.split("g.")[0][-1]))
    gi, last = None, None
    for profile in flat:
        g = int(profile.split("g.")[0])
        i, j = gi_index[g], ci_index[g]
        gi_profile = n.nvmlDeviceGetGpuInstanceProfileInfo(h, i, 1)
        reuse = gi is not None and last == i
        last = i
        while True:
            if not reuse:
                gi = n.nvmlDeviceCreateGpuInstance(h, gi_profile.id)
            ci_profile = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, j, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            try:
                n.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
            except n.NVMLError as e:
                if reuse:
                    steps.append(["reuse_refused", e.value])
                    reuse = False
                    continue
                raise
            made = _mig_parted_profile(n, h, i, j, gi_profile, ci_profile)
            assert made == profile, f"unsupported MIG Device specified {profile}, expected {made} instead"
            break
    return dict(steps=steps, config=mig_parted_get_config(n, h))


def mig_parted_assert(gpu: int) -> dict:
    n = nvml()
    h = n.nvmlDeviceGetHandleByIndex(gpu)
    current, pending = n.nvmlDeviceGetMigMode(h)
    return dict(mode=[current, pending], config=mig_parted_get_config(n, h))


# ---- the DRA driver ---------------------------------------------------------------------------


def dra_driver() -> dict:
    """NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/nvlib.go, enumerateGpusAndMigDevices: per
    GPU (getGpuInfo) nvmlDeviceGetMinorNumber, UUID, IsMigEnabled, memory, name, and its MIG
    profiles: every profile index (skipping NOT_SUPPORTED, INVALID_ARGUMENT) with its possible
    placements (go-nvml asks for the count with a NULL buffer, then fills), kept where C == G;
    a GPU without MIG is one device `gpu-<index>`; one with MIG is its MIG devices (getMigDevices:
    walkMigDevices, then nvmlDeviceGetGpuInstanceId, nvmlDeviceGetGpuInstanceById,
    nvmlGpuInstanceGetInfo, nvmlDeviceGetComputeInstanceId, nvmlGpuInstanceGetComputeInstanceById,
    nvmlComputeInstanceGetInfo, nvmlDeviceGetUUID, the profile whose GPU and compute instance
    profile ids match), each named `gpu-<index>-mig-<GI profile id>-<start>-<size>`
    (deviceinfo.go, CanonicalName)."""
    n = nvml()
    devices = {}
    for index, h in enumerate(gpus(n)):
        total = n.nvmlDeviceGetMemoryInfo(h).total
        profiles = []
        for i, info in gi_profiles(n, h):
            try:
                count = n.c_uint(0)
                n.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, None, n.byref(count))
                buf = (n.c_nvmlGpuInstancePlacement_t * count.value)()
                n.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, buf, n.byref(count))
            except n.NVMLError as e:
                if e.value in (n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise
            placements = [(p.start, p.size) for p in buf[:count.value]]
            for j in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                if j in CI_SLICES:
                    p = go_nvlib_profile(i, j, info.memorySizeMB, total)
                    if p["C"] == p["G"]:
                        profiles.append(dict(p, placements=placements))
        if not go_nvlib_mig_enabled(n, h):
            devices[f"gpu-{index}"] = dict(uuid=_text(n.nvmlDeviceGetUUID(h)), minor=n.nvmlDeviceGetMinorNumber(h),
                                           profiles=len(profiles))
            continue
        for _k, m in go_nvlib_visit_mig_devices(n, h):
            gi = n.nvmlDeviceGetGpuInstanceById(h, n.nvmlDeviceGetGpuInstanceId(m))
            gi_info = n.nvmlGpuInstanceGetInfo(gi)
            ci = n.nvmlGpuInstanceGetComputeInstanceById(gi, n.nvmlDeviceGetComputeInstanceId(m))
            ci_info = n.nvmlComputeInstanceGetInfo(ci)
            found = None
            for p in profiles:
                if n.nvmlDeviceGetGpuInstanceProfileInfo(h, p["gi"], 1).id != gi_info.profileId:
                    continue
                try:
                    cip = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, p["ci"], 0)
                except n.NVMLError:
                    continue
                if cip.id == ci_info.profileId:
                    found = p
            assert found, "error getting profile info for MIG device"
            name = f"gpu-{index}-mig-{gi_info.profileId}-{gi_info.placement.start}-{gi_info.placement.size}"
            devices[name] = dict(uuid=_text(n.nvmlDeviceGetUUID(m)), profile=found["name"],
                                 placements=found["placements"])
    return devices


# ---- the tests --------------------------------------------------------------------------------


@pytest.fixture
def node(node_factory):
    return node_factory(gpus=2)


def all_1g(node, gpu: int) -> None:
    layout(node, gpu, "enable")
    layout(node, gpu, "create", ",".join(["1g.10gb"] * 7))


def balanced(node, gpu: int) -> None:
    layout(node, gpu, "enable")
    layout(node, gpu, "create", "3g.40gb,2g.20gb,1g.10gb,1g.10gb")


def test_go_nvlib_names_each_mig_device_by_the_profile_nvidia_smi_lists(node):
    """The profile string every Go consumer keys on is computed from memory, not read from NVML:
    our parent memory and slice memory must give back `-lgip`'s names."""
    layout(node, 0, "enable")
    layout(node, 0, "create", "3g.40gb,1g.20gb,1g.10gb,1g.10gb+me")
    out = replay(node, "mig_profile_names", 0)
    assert sorted(out) == ["1g.10gb", "1g.10gb+me", "1g.20gb", "3g.40gb"]


def mig_profile_names(gpu: int) -> list[str]:
    n = nvml()
    h = n.nvmlDeviceGetHandleByIndex(gpu)
    return [go_nvlib_mig_profile_of(n, m)["name"] for _j, m in go_nvlib_visit_mig_devices(n, h)]


def test_device_plugin_single_strategy_advertises_every_mig_device_as_nvidia_com_gpu(node):
    all_1g(node, 0)
    all_1g(node, 1)
    out = replay(node, "device_plugin", "single", str(node.mnt))
    assert "error" not in out, out
    devices = out["resources"]["nvidia.com/gpu"]
    assert list(out["resources"]) == ["nvidia.com/gpu"] and len(devices) == 14
    assert [d["index"] for d in devices] == [f"{i}:{j}" for i in (0, 1) for j in range(7)]
    assert all(d["id"].startswith("MIG-") for d in devices) and len({d["id"] for d in devices}) == 14
    for d in devices:  # what the plugin mounts: the parent, and the two capability nodes, which exist
        parent, gi_cap, ci_cap = d["paths"]
        assert parent in ("/dev/nvidia0", "/dev/nvidia1")
        assert (node.mnt / gi_cap[1:]).exists() and (node.mnt / ci_cap[1:]).exists()


@pytest.mark.parametrize("setup, error", [
    ("mixed", "more than one MIG device type present on node"),
    ("half", "all devices on the node must be configured with the same migEnabled value"),
    ("empty", "device 0 has an invalid MIG configuration"),
])
def test_device_plugin_single_strategy_refuses_a_layout_it_cannot_advertise(node, setup, error):
    if setup == "mixed":
        balanced(node, 0)
        all_1g(node, 1)
    elif setup == "half":
        all_1g(node, 0)
    else:
        all_1g(node, 0)
        layout(node, 1, "enable")
    out = replay(node, "device_plugin", "single", str(node.mnt))
    assert error in out.get("error", ""), out


def test_device_plugin_mixed_strategy_advertises_one_resource_per_profile(node):
    balanced(node, 0)
    out = replay(node, "device_plugin", "mixed", str(node.mnt))
    resources = {name: len(devices) for name, devices in out["resources"].items()}
    assert resources == {"nvidia.com/gpu": 1, "nvidia.com/mig-3g.40gb": 1, "nvidia.com/mig-2g.20gb": 1,
                         "nvidia.com/mig-1g.10gb": 2}
    assert out["resources"]["nvidia.com/gpu"][0]["paths"] == ["/dev/nvidia1"]
    mig = [d["index"] for name, devices in out["resources"].items() if name != "nvidia.com/gpu" for d in devices]
    assert sorted(mig) == ["0:0", "0:1", "0:2", "0:3"]
    # what mixed could advertise: every profile of the board's table with C == G, named from memory
    assert sorted(out["mig_patterns"]) == [f"nvidia.com/mig-{p}" for p in (
        "1g.10gb", "1g.10gb.me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")]


def test_device_plugin_health_check_marks_the_mig_device_an_xid_names(node):
    all_1g(node, 0)
    ids = replay(node, "mig_ids", 0)  # (uuid, gi, ci) in MIG device order
    last_uuid, last_gi, last_ci = ids[-1]
    first_uuid, first_gi, first_ci = ids[0]
    out = replay(node, "device_plugin_health", str(node.mnt), [
        [0, f"69 gi={last_gi} ci={last_ci}"],    # the device the plugin kept for GPU 0
        [0, f"69 gi={first_gi} ci={first_ci}"],  # another: keyed by parent, the plugin never sees it
        [0, "69"],                                # the whole GPU: the device it kept
        [0, f"31 gi={last_gi} ci={last_ci}"],    # an application error: ignored
    ])
    assert [(e["xid"], e["gi"], e["ci"]) for e in out] == [
        (69, last_gi, last_ci), (69, first_gi, first_ci), (69, 0xFFFFFFFF, 0xFFFFFFFF), (31, last_gi, last_ci)]
    assert [e["unhealthy"] for e in out] == [[last_uuid], [], [last_uuid], []]
    assert first_uuid != last_uuid


def mig_ids(gpu: int) -> list:
    n = nvml()
    h = n.nvmlDeviceGetHandleByIndex(gpu)
    return [(_text(n.nvmlDeviceGetUUID(m)), n.nvmlDeviceGetGpuInstanceId(m), n.nvmlDeviceGetComputeInstanceId(m))
            for _j, m in go_nvlib_visit_mig_devices(n, h)]


def test_gpu_feature_discovery_labels_under_single(node):
    all_1g(node, 0)
    all_1g(node, 1)
    labels = replay(node, "gpu_feature_discovery", "single")
    expected = {"nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "single",
                "nvidia.com/gpu.product": f"{H100.replace(' ', '-')}-MIG-1g.10gb", "nvidia.com/gpu.count": "14",
                "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.memory": "9984", "nvidia.com/gpu.multiprocessors": "16",
                "nvidia.com/gpu.slices.gi": "1", "nvidia.com/gpu.slices.ci": "1", "nvidia.com/gpu.engines.copy": "1",
                "nvidia.com/gpu.engines.decoder": "1", "nvidia.com/gpu.engines.encoder": "0",
                "nvidia.com/gpu.engines.jpeg": "1", "nvidia.com/gpu.engines.ofa": "0",
                "nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.compute.major": "9",
                "nvidia.com/gpu.compute.minor": "0"}
    assert labels == expected


def test_gpu_feature_discovery_labels_under_mixed_and_an_invalid_single(node):
    balanced(node, 0)
    labels = replay(node, "gpu_feature_discovery", "mixed")
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    # the full GPU's labels count every GPU of its name, MIG-enabled ones too (newGPULabelers)
    assert labels["nvidia.com/gpu.product"] == H100.replace(" ", "-") and labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.memory"] == "81559" and labels["nvidia.com/gpu.replicas"] == "1"
    mig = {k: v for k, v in labels.items() if k.startswith("nvidia.com/mig-")}
    for profile, count, mib, sms, slices, engines in (("3g.40gb", 1, 40448, 60, 3, (3, 3, 0, 3, 0)),
                                                      ("2g.20gb", 1, 20096, 32, 2, (2, 2, 0, 2, 0)),
                                                      ("1g.10gb", 2, 9984, 16, 1, (1, 1, 0, 1, 0))):
        r = f"nvidia.com/mig-{profile}"
        assert mig.pop(f"{r}.product") == f"{H100.replace(' ', '-')}-MIG-{profile}"
        assert [mig.pop(f"{r}.{k}") for k in ("count", "replicas", "memory", "multiprocessors", "slices.gi",
                                               "slices.ci")] == [str(count), "1", str(mib), str(sms), str(slices),
                                                                 str(slices)]
        assert [mig.pop(f"{r}.engines.{e}") for e in ("copy", "decoder", "encoder", "jpeg", "ofa")] == \
            [str(e) for e in engines]
    assert mig == {}
    single = replay(node, "gpu_feature_discovery", "single")  # GPU 1 has MIG off: a mix
    assert single["nvidia.com/gpu.product"] == f"{H100.replace(' ', '-')}-MIG-INVALID"
    assert [single[f"nvidia.com/gpu.{k}"] for k in ("count", "replicas", "memory")] == ["0", "0", "0"]


def test_mig_parted_applies_and_asserts_all_1g_10gb_then_all_balanced(node):
    first = replay(node, "mig_parted_apply", 0, {"1g.10gb": 7})
    # Six of the seven reuse the last 1g.10gb instance first, as mig-parted does: its compute
    # instance is refused there (the one slice is taken), and a new GPU instance is made.
    assert first["steps"][:3] == [["set_mode", 0], ["pending", False], ["cleared", {}]]
    assert first["steps"][3:] == [["reuse_refused", 23]] * 6  # NVML_ERROR_INSUFFICIENT_RESOURCES
    assert first["config"] == {"1g.10gb": 7}
    second = replay(node, "mig_parted_apply", 0, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1})
    assert second["steps"] == [["pending", False], ["cleared", {}], ["reuse_refused", 23]]
    assert second["config"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert replay(node, "mig_parted_assert", 0) == dict(mode=[1, 1], config={"1g.10gb": 2, "2g.20gb": 1,
                                                                             "3g.40gb": 1})
    assert sorted(line.split()[3] for line in node.read("gpu0/mig").splitlines() if line.startswith("gi ")) == [
        "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    node.expect_warning(r"ctl\.sock: insufficient_resources from uid 0")


def test_dra_driver_publishes_full_gpus_and_mig_devices_by_profile_and_placement(node):
    balanced(node, 0)
    devices = replay(node, "dra_driver")
    gpu1 = devices.pop("gpu-1")
    assert gpu1["minor"] == 1 and gpu1["uuid"].startswith("GPU-")
    # MIG off, GPU 1 still knows its profiles (v1 answers; docs/mig.md), which the driver's dynamic
    # MIG announces before it enables MIG on demand: -lgip's seven, each with its full-size compute
    # profile, the three 1-slice ones twice (compute profiles 1_SLICE and 1_SLICE_REV1, both C == G)
    assert gpu1["profiles"] == 10
    # each name is the GPU instance's profile id and placement, as the model shows them in gpu0/mig
    instances = [line.split() for line in node.read("gpu0/mig").splitlines() if line.startswith("gi ")]
    assert sorted(devices) == sorted(f"gpu-0-mig-{gi[5]}-{gi[7].replace(':', '-')}" for gi in instances)
    placements = {d["profile"]: d["placements"] for d in devices.values()}
    assert placements == {"3g.40gb": [[0, 4], [4, 4]], "2g.20gb": [[0, 2], [2, 2], [4, 2]],
                          "1g.10gb": [[k, 1] for k in range(7)]}  # -lgipp's, the H100 table
    assert all(d["uuid"].startswith("MIG-") for d in devices.values())
