"""Multi-Instance GPU as data and rules: one GPU's MIG mode (current and pending), its GPU
instances and their compute instances, the events that change them, and the driver's rules for
where an instance goes, which id it gets and why it is refused (docs/mig.md).

Pure: each rule takes the board's MIG tables (`profiles.Mig`) and a `MigState` and returns a new
`MigState` or raises; the node (model/node.py) applies the result in one step. A list of
instances is placed whole or not at all.

Refusals carry NVML's error: `InsufficientResources` (no room: the placement is taken, the
profile's instances are all in use, the compute slices are spent), `InvalidCommand` (a profile or
placement the board does not have: INVALID_ARGUMENT), `InUse` (a GPU instance that still has
compute instances, an instance a process runs on, MIG turned off under instances),
`NotFound` (no instance of that id), `config.NotSupported` (a board without MIG, or MIG off).
"""
from __future__ import annotations

import errno
import hashlib
import re
from dataclasses import dataclass, field, replace

from mokkafs.model.config import NotSupported
from mokkafs.model.events import Event, InvalidCommand, whole_number
from mokkafs.model.schema import GpuProfile, Mig, MigComputeProfile, MigGpuProfile, compute_span
from mokkafs.model import state_limits

MAX_GPU_INSTANCES = state_limits.MAX_GPU_INSTANCES  # per GPU: a 7-instance layout, and 8 memory slices
MAX_COMPUTE_INSTANCES = 8  # per GPU instance (a 7g GPU instance splits into at most 7; NVML counts 8 slices)
MAX_LIST = 8  # instances one command may create
# The driver's minors of the MIG capability files (proc/driver/nvidia-caps/mig-minors): 15 GPU
# instance ids per GPU, each with its own minor followed by those of its 8 compute instances.
CAPS_FIRST_MINOR = 3
CAPS_GPU_STRIDE = 135
CAPS_GI_STRIDE = 9


class InsufficientResources(InvalidCommand):
    """No room for the instance: NVML_ERROR_INSUFFICIENT_RESOURCES."""

    errno = errno.ENOSPC


class InUse(InvalidCommand):
    """NVML_ERROR_IN_USE: compute instances or processes are on it."""

    errno = errno.EBUSY


class NotFound(InvalidCommand):
    """NVML_ERROR_NOT_FOUND: no instance with that id."""

    errno = errno.ENOENT


# --- state ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ComputeInstance:
    id: int
    profile: int  # NVML_COMPUTE_INSTANCE_PROFILE_* (also the id the driver reports)
    start: int  # first compute slice inside its GPU instance
    size: int  # compute slices


@dataclass(frozen=True)
class GpuInstance:
    id: int
    profile: int  # NVML_GPU_INSTANCE_PROFILE_* (the index; the reported id is the table's `id`)
    start: int  # first memory slice
    size: int  # memory slices
    compute: tuple[ComputeInstance, ...] = ()  # by id

    def ci(self, ci_id: int) -> ComputeInstance:
        for c in self.compute:
            if c.id == ci_id:
                return c
        raise NotFound(f"GPU instance {self.id} has no compute instance {ci_id}")


@dataclass(frozen=True)
class MigState:
    """One GPU's MIG configuration. `pending` is the mode the next activation (a GPU reset, or the
    driver's own reset when nothing uses the GPU) sets; it equals `enabled` when none is due."""

    enabled: bool = False
    pending: bool = False
    instances: tuple[GpuInstance, ...] = ()  # by id

    def gi(self, gi_id: int) -> GpuInstance:
        for g in self.instances:
            if g.id == gi_id:
                return g
        raise NotFound(f"no GPU instance {gi_id}")

    def to_dict(self) -> dict:
        return {
            "enabled": self.enabled,
            "pending": self.pending,
            "instances": [
                {"id": g.id, "profile": g.profile, "start": g.start, "size": g.size,
                 "compute": [[c.id, c.profile, c.start, c.size] for c in g.compute]}
                for g in self.instances
            ],
        }

    @classmethod
    def from_dict(cls, data: object) -> "MigState":
        """The shape only (ValueError naming the key); whether it fits the board is `check`'s."""
        def whole(v: object, what: str) -> int:
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 0xFF:
                raise ValueError(f"mig.{what}: not a small whole number")
            return v

        if not isinstance(data, dict):
            raise ValueError("mig: not a mapping")
        enabled, pending, instances = data.get("enabled"), data.get("pending"), data.get("instances")
        if not isinstance(enabled, bool) or not isinstance(pending, bool):
            raise ValueError("mig.enabled, mig.pending: not booleans")
        if not isinstance(instances, list) or len(instances) > MAX_GPU_INSTANCES:
            raise ValueError(f"mig.instances: not a list of at most {MAX_GPU_INSTANCES}")
        gis = []
        for k, g in enumerate(instances):
            if not isinstance(g, dict) or not isinstance(g.get("compute"), list):
                raise ValueError(f"mig.instances.{k}: not a GPU instance record")
            cis = []
            for c in g["compute"][: MAX_COMPUTE_INSTANCES + 1]:
                if not isinstance(c, list) or len(c) != 4:
                    raise ValueError(f"mig.instances.{k}.compute: not [id, profile, start, size]")
                cis.append(ComputeInstance(*(whole(v, f"instances.{k}.compute") for v in c)))
            gis.append(GpuInstance(*(whole(g.get(key), f"instances.{k}.{key}") for key in
                                     ("id", "profile", "start", "size")), tuple(cis)))
        return cls(enabled, pending, tuple(gis))


# --- the board's tables ----------------------------------------------------------------------------


def tables(profile: GpuProfile) -> Mig:
    """The board's MIG tables; NotSupported on a board without MIG, as the driver answers."""
    if profile.mig is None:
        raise NotSupported(f"{profile.name} does not support MIG")
    return profile.mig


def gi_profile(mig: Mig, ref: int | str) -> MigGpuProfile:
    """A GPU instance profile by the id the driver reports (`19`, what `nvidia-smi mig -cgi` and
    nvmlDeviceCreateGpuInstance take) or by name (`1g.10gb`)."""
    for p in mig.gpu_instance_profiles:
        if (p.id if isinstance(ref, int) else p.name) == ref:
            return p
    raise InvalidCommand(f"no GPU instance profile {ref!r}; known: {', '.join(f'{p.name} ({p.id})' for p in mig.gpu_instance_profiles)}")


def gi_profile_by_index(mig: Mig, index: int) -> MigGpuProfile:
    """By NVML_GPU_INSTANCE_PROFILE_* (what a stored instance records)."""
    for p in mig.gpu_instance_profiles:
        if p.profile == index:
            return p
    raise InvalidCommand(f"no GPU instance profile index {index}")


def ci_profile(gp: MigGpuProfile, ref: int | str) -> MigComputeProfile:
    """A compute instance profile of GPU instance profile `gp`, by id (`0`, the index the driver
    reports) or name (`1c.3g.40gb`; the full-size one by the GPU instance's name)."""
    for c in gp.compute_profiles:
        if (c.profile if isinstance(ref, int) else c.name) == ref:
            return c
    known = ", ".join(f"{c.name} ({c.profile})" for c in gp.compute_profiles)
    raise InvalidCommand(f"no compute instance profile {ref!r} in {gp.name}; known: {known}")


def halves_swapped(mig: Mig, gpu: int) -> bool:
    """Whether GPU `gpu` is one whose GPU-instance ids count the memory halves the other way
    round (`Mig.swapped_halves`, docs/mig.md): on real boards this depends on which of the die's
    GPCs is fused off, and differs between GPUs of one node."""
    return gpu in mig.swapped_halves


def gi_id(mig: Mig, start: int, size: int, swapped: bool = False) -> int:
    """The id the driver gives a GPU instance at placement `start:size`: the place, in the
    binary tree of memory slices (0 the whole GPU, 1-2 the halves, 3-6 the quarters, 7-14 the
    eighths), of the memory the instance gets (the driver's swizzId). That memory is the
    placement itself on most GPUs; on a GPU whose halves are swapped it is the placement in the
    other half (start XOR 4 on an 8-slice board), so the same placement has id 1 there where it
    has id 2 elsewhere. The whole GPU is id 0 either way."""
    slices = mig.memory_slices
    if slices & (slices - 1) == 0 and size & (size - 1) == 0 and start % size == 0:
        half = slices // 2
        memory = start ^ half if swapped and size <= half else start
        return slices // size - 1 + memory // size
    raise InvalidCommand(f"placement {start}:{size} is not on the board's slice tree")  # pragma: no cover - tables are checked


def caps_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The minor of `nvidia-caps/nvidia-capN` for `gpu<minor>/gi<gi>/access` (ci None) or
    `gpu<minor>/gi<gi>/ci<ci>/access`, as `mig-minors` lists them."""
    base = CAPS_FIRST_MINOR + CAPS_GPU_STRIDE * gpu_minor + CAPS_GI_STRIDE * gi
    return base if ci is None else base + 1 + ci


def mig_uuid(gpu_uuid: str, gi: int, ci: int) -> str:
    """`MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`: derived from the parent's UUID and the
    instance ids, so the same layout has the same UUIDs after a restart or a re-creation."""
    h = hashlib.sha256(f"{gpu_uuid}/gi{gi}/ci{ci}".encode()).hexdigest()
    return f"MIG-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def device_name(product_name: str, gp: MigGpuProfile, cp: MigComputeProfile) -> str:
    """What NVML names a MIG device: `NVIDIA H100 80GB HBM3 MIG 1g.10gb`; a compute instance
    smaller than its GPU instance names itself (`... MIG 1c.3g.40gb`)."""
    return f"{product_name} MIG {cp.name if cp.slices < gp.slices else gp.name}"


# --- placement rules ---------------------------------------------------------------------------------


def _taken(spans) -> set[int]:
    return {s for start, size in spans for s in range(start, start + size)}


def _free(profile, size: int, taken: set[int]) -> list[int]:
    """The starts of `profile`'s placements (each `size` long) that overlap nothing in `taken`."""
    return [p for p in profile.placements if not taken & set(range(p, p + size))]


def _room_left(mig: Mig, taken: set[int]) -> int:
    """How much room a GPU with memory slices `taken` still has: the placements of every GPU
    instance profile that are still free, counted together. The driver places a new instance
    where this stays largest (below)."""
    return sum(len(_free(q, q.placement_size, taken)) for q in mig.gpu_instance_profiles)


def place_gpu_instance(mig: Mig, state: MigState, gp: MigGpuProfile, start: int | None,
                       swapped: bool = False) -> GpuInstance:
    """Where the driver puts a new instance of `gp` (at `start`, or where it chooses), and its
    id (`gi_id`; `swapped`: `halves_swapped` of the GPU).

    The choice (docs/mig.md, tests/fixtures/mig_sequences.yaml): of the free placements, the
    one that leaves the most room for later instances (`_room_left`), the lowest start among
    equals. This is the rule the driver's open kernel module states for compute instances
    (kmigmgrGetFreeCTSId: the CTS id that "will reduce the remaining capacity the least", the
    first one on a tie); the GPU instance choice is made in firmware, and this rule reproduces
    every real creation sequence collected: a lone 3g.40gb goes to 4:4, a 2g.20gb after it to
    0:2, seven 1g.10gb to 6, 4, 5, 0, 1, 2, 3."""
    if start is not None and start not in gp.placements:
        raise InvalidCommand(f"{gp.name} cannot start at memory slice {start}; placements: "
                             f"{', '.join(str(p) for p in gp.placements)}")
    if sum(1 for g in state.instances if g.profile == gp.profile) >= gp.instances:
        raise InsufficientResources(f"{gp.name}: all {gp.instances} instances are in use")
    used_compute = sum(gi_profile_by_index(mig, g.profile).slices for g in state.instances)
    if used_compute + gp.slices > mig.compute_slices:
        raise InsufficientResources(f"{gp.name}: {mig.compute_slices - used_compute} compute slices left, needs {gp.slices}")
    size = gp.placement_size
    taken = _taken((g.start, g.size) for g in state.instances)
    free = _free(gp, size, taken)
    if start is not None:
        if start not in free:
            raise InsufficientResources(f"{gp.name} at {start}:{size} overlaps an instance")
        chosen = start
    elif not free:
        raise InsufficientResources(f"{gp.name}: no free placement")
    else:
        chosen = max(free, key=lambda p: (_room_left(mig, taken | set(range(p, p + size))), -p))
    return GpuInstance(gi_id(mig, chosen, size, swapped), gp.profile, chosen, size)


def ci_span(cp: MigComputeProfile) -> int:
    """How many placement units a compute instance of `cp` spans inside its GPU instance, as
    `nvidia-smi mig -lci` prints it: its compute size class rounded up to a power of two (1, 2,
    4, 4, 8 for 1, 2, 3, 4 and 7 slices; `schema.compute_span`). The driver sizes a compute
    instance by that class (VEIDs and CTS ids in the open kernel module, kgrmgrCheckVeidsRequest
    and kmigmgrCtsIdToSpan), so a real H100 lists its 3g.40gb compute instance at 0:4."""
    return compute_span(cp.slices)


def place_compute_instance(gp: MigGpuProfile, gi: GpuInstance, cp: MigComputeProfile, start: int | None) -> ComputeInstance:
    """A new compute instance of `cp` in `gi`: at `start` or the lowest free placement (the
    driver's first fit over VEID spans, kgrmgrCheckVeidsRequest), with the lowest free id, as
    `nvidia-smi mig -lci` shows the driver doing (a real A100 80GB at 515: two 1c.3g.40gb at 0:1
    and 1:1); it spans `ci_span(cp)`. The compute slices of a GPU instance's compute instances
    together never exceed its own: a 3g instance holds a 1c at 0:1 and a 2c at 2:2, as a real
    H200 at 590 runs them, or three 1c, but not two 1c and a 2c."""
    if start is not None and start not in cp.placements:
        raise InvalidCommand(f"{cp.name} cannot start at compute slice {start}; placements: "
                             f"{', '.join(str(p) for p in cp.placements)}")
    if sum(1 for c in gi.compute if c.profile == cp.profile) >= cp.instances:
        raise InsufficientResources(f"{cp.name}: all {cp.instances} instances are in use in GPU instance {gi.id}")
    span = ci_span(cp)
    free = _free(cp, span, _taken((c.start, c.size) for c in gi.compute))
    if start is not None:
        if start not in free:
            raise InsufficientResources(f"{cp.name} at {start}:{span} overlaps a compute instance")
    elif not free:
        raise InsufficientResources(f"{cp.name}: no free placement in GPU instance {gi.id}")
    in_use = sum(ci_profile(gp, c.profile).slices for c in gi.compute)
    if in_use + cp.slices > gp.slices:
        raise InsufficientResources(f"{cp.name}: {gp.slices - in_use} compute slices left in GPU instance {gi.id}, "
                                    f"needs {cp.slices}")
    ids = {c.id for c in gi.compute}
    new_id = next(i for i in range(MAX_COMPUTE_INSTANCES + 1) if i not in ids)
    return ComputeInstance(new_id, cp.profile, min(free) if start is None else start, span)


def remaining_gpu_instances(mig: Mig, state: MigState, gp: MigGpuProfile) -> int:
    """How many more instances of `gp` fit now, each where the driver would put it
    (nvmlDeviceGetGpuInstanceRemainingCapacity, `-lgip`'s Free). Ids play no part here, so
    the GPU's `halves_swapped` does not matter."""
    n = 0
    while True:
        try:
            state = _with_gi(state, place_gpu_instance(mig, state, gp, None))
        except InvalidCommand:
            return n
        n += 1


def remaining_compute_instances(gp: MigGpuProfile, gi: GpuInstance, cp: MigComputeProfile) -> int:
    """How many more compute instances of `cp` fit in `gi` now
    (nvmlGpuInstanceGetComputeInstanceRemainingCapacity, `-lcip`'s Free)."""
    n = 0
    while len(gi.compute) < MAX_COMPUTE_INSTANCES:
        try:
            gi = _with_ci(gi, place_compute_instance(gp, gi, cp, None))
        except InvalidCommand:
            break
        n += 1
    return n


def _with_gi(state: MigState, gi: GpuInstance) -> MigState:
    rest = [g for g in state.instances if g.id != gi.id]
    return replace(state, instances=tuple(sorted(rest + [gi], key=lambda g: g.id)))


def _with_ci(gi: GpuInstance, ci: ComputeInstance) -> GpuInstance:
    return replace(gi, compute=tuple(sorted([c for c in gi.compute if c.id != ci.id] + [ci], key=lambda c: c.id)))


def _enabled(state: MigState, name: str) -> None:
    if not state.enabled:
        raise NotSupported(f"MIG mode is not enabled on {name}")


def upgrade(mig: Mig, state: MigState) -> MigState:
    """A record saved before compute instances were sized by their span (`ci_span`), when a
    compute instance's `size` was its slice count (3 for a 3g.40gb one): the same layout with
    today's sizes. Anything else is returned as it is, for `check` to judge."""
    gis = []
    for g in state.instances:
        try:
            gp = gi_profile_by_index(mig, g.profile)
            cis = tuple(replace(c, size=ci_span(cp)) if c.size == cp.slices else c
                        for c in g.compute for cp in (ci_profile(gp, c.profile),))
        except InvalidCommand:
            return state
        gis.append(replace(g, compute=cis))
    return replace(state, instances=tuple(gis))


def check(mig: Mig, state: MigState, gpu: int) -> None:
    """Raise ValueError unless `state` is one the rules could have built on GPU `gpu` of this
    board (a restored record): every instance re-placed at its own placement, in order."""
    if state.instances and not state.enabled:
        raise ValueError("mig: instances while MIG mode is disabled")
    rebuilt = MigState(True, True)
    try:
        for g in state.instances:
            gp = gi_profile_by_index(mig, g.profile)
            placed = place_gpu_instance(mig, rebuilt, gp, g.start, halves_swapped(mig, gpu))
            if (placed.id, placed.size) != (g.id, g.size):
                raise InvalidCommand(f"GPU instance {g.id} does not match its placement {g.start}:{g.size}")
            for c in g.compute:
                cp = ci_profile(gp, c.profile)
                ci = place_compute_instance(gp, placed, cp, c.start)
                if c.size != ci.size or c.id in {x.id for x in placed.compute} or c.id > MAX_COMPUTE_INSTANCES:
                    raise InvalidCommand(f"compute instance {c.id} of GPU instance {g.id} does not fit")
                placed = _with_ci(placed, replace(ci, id=c.id))
            rebuilt = _with_gi(rebuilt, placed)
    except InvalidCommand as e:
        raise ValueError(f"mig: {e}") from None


# --- events ----------------------------------------------------------------------------------------

# One request of a create command: a profile (an id or a name) and a placement start or None.
Request = tuple[int | str, int | None]


def _check_requests(requests: tuple) -> tuple[Request, ...]:
    if not isinstance(requests, tuple) or not 1 <= len(requests) <= MAX_LIST:
        raise InvalidCommand(f"a create command takes 1..{MAX_LIST} profiles")
    for r in requests:
        if not (isinstance(r, tuple) and len(r) == 2):
            raise InvalidCommand("a profile request is (profile, start or None)")
        ref, start = r
        if not (isinstance(ref, str) or (isinstance(ref, int) and not isinstance(ref, bool) and 0 <= ref <= 0xFF)):
            raise InvalidCommand(f"bad profile {ref!r}")
        if start is not None and not (isinstance(start, int) and not isinstance(start, bool) and 0 <= start < 8):
            raise InvalidCommand(f"bad placement start {start!r}")
    return requests


def _check_id(value: object, what: str) -> None:
    if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0xFF):
        raise InvalidCommand(f"bad {what} id {value!r}")


@dataclass(frozen=True)
class MigEvent(Event):
    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gpu is None:
            raise InvalidCommand("MIG belongs to one GPU")


@dataclass(frozen=True)
class SetMigMode(MigEvent):
    """`nvidia-smi -mig 1|0`, nvmlDeviceSetMigMode."""

    enable: bool = True


@dataclass(frozen=True)
class CreateGpuInstances(MigEvent):
    """GPU instances, each of a profile at an optional placement; `default_ci` also creates
    each one's full-size compute instance (`nvidia-smi mig -cgi LIST -C`)."""

    requests: tuple = ()
    default_ci: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_requests(self.requests)


@dataclass(frozen=True)
class CreateComputeInstances(MigEvent):
    """Compute instances in GPU instance `gi` (`nvidia-smi mig -gi GI -cci LIST`)."""

    gi: int = 0
    requests: tuple = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_id(self.gi, "GPU instance")
        _check_requests(self.requests)


@dataclass(frozen=True)
class DestroyComputeInstances(MigEvent):
    """Compute instance `ci` of GPU instance `gi`; None: all of them (`-dci`)."""

    gi: int | None = None
    ci: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_id(self.gi, "GPU instance")
        _check_id(self.ci, "compute instance")


@dataclass(frozen=True)
class DestroyGpuInstances(MigEvent):
    """GPU instance `gi`, None: all (`-dgi`); with `compute`, their compute instances first
    (what mig-parted does to clear a GPU)."""

    gi: int | None = None
    compute: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_id(self.gi, "GPU instance")


@dataclass(frozen=True)
class Outcome:
    """What a MIG event did: the new state, the log line, and what the control socket answers
    (the created instances as `gi=ID[/ci=ID]`, or `pending in_use` for a deferred mode)."""

    state: MigState
    log: str
    reply: str = ""
    created: tuple[tuple[int, int | None], ...] = field(default=())


def busy(processes_on: dict[int, tuple[int, int]], gi: int, ci: int | None = None) -> bool:
    """Does a process run on GPU instance `gi` (compute instance `ci`)? `processes_on` maps a
    pid to its (gi, ci)."""
    return any(g == gi and (ci is None or c == ci) for g, c in processes_on.values())


def check_board(profile: GpuProfile, event: MigEvent) -> None:
    """What the board alone says of `event`, whatever its GPU's state: no MIG at all
    (NOT_SUPPORTED), a GPU instance profile it lacks or a placement start that profile does not
    have (INVALID_ARGUMENT)."""
    mig = tables(profile)
    if isinstance(event, CreateGpuInstances):
        for ref, start in event.requests:
            gp = gi_profile(mig, ref)
            if start is not None and start not in gp.placements:
                raise InvalidCommand(f"{gp.name} cannot start at memory slice {start}; placements: "
                                     f"{', '.join(str(p) for p in gp.placements)}")


def apply(profile: GpuProfile, state: MigState, event: MigEvent, *, gpu_busy: bool,
          processes_on: dict[int, tuple[int, int]]) -> Outcome:
    """The rules: `event` on `state` gives an `Outcome`, or raises with NVML's error. `gpu_busy`:
    a process holds the GPU (a mode change then waits for a reset); `processes_on`: which
    instance each process runs on."""
    mig = tables(profile)
    name = f"gpu{event.gpu}"
    swapped = halves_swapped(mig, event.gpu)
    if isinstance(event, SetMigMode):
        word = "enabled" if event.enable else "disabled"
        if event.enable == state.enabled:
            return Outcome(replace(state, pending=event.enable), f"MIG mode {word}", "")
        if not event.enable and state.instances:
            raise InUse(f"{name} has GPU instances; destroy them before disabling MIG")
        if gpu_busy:
            # The driver cannot reset a GPU a process holds: the mode waits for the next reset.
            return Outcome(replace(state, pending=event.enable), f"MIG mode {word} on next reset (GPU in use)",
                           "pending in_use")
        return Outcome(MigState(event.enable, event.enable), f"MIG mode {word}", "")
    _enabled(state, name)
    if isinstance(event, CreateGpuInstances):
        new, created = state, []
        for ref, start in event.requests:
            gp = gi_profile(mig, ref)
            gi = place_gpu_instance(mig, new, gp, start, swapped)
            if event.default_ci:
                full = max(gp.compute_profiles, key=lambda c: c.slices)
                gi = _with_ci(gi, place_compute_instance(gp, gi, full, None))
            new = _with_gi(new, gi)
            created.append((gi.id, 0 if event.default_ci else None))
        return Outcome(new, _created_line(mig, new, created, gis=True), _reply(created), tuple(created))
    if isinstance(event, CreateComputeInstances):
        gi = state.gi(event.gi)
        gp = gi_profile_by_index(mig, gi.profile)
        created = []
        for ref, start in event.requests:
            if len(gi.compute) >= MAX_COMPUTE_INSTANCES:
                raise InsufficientResources(f"GPU instance {gi.id} has {MAX_COMPUTE_INSTANCES} compute instances")
            ci = place_compute_instance(gp, gi, ci_profile(gp, ref), start)
            gi = _with_ci(gi, ci)
            created.append((gi.id, ci.id))
        new = _with_gi(state, gi)
        return Outcome(new, _created_line(mig, new, created, gis=False), _reply(created), tuple(created))
    if isinstance(event, DestroyComputeInstances):
        gis = state.instances if event.gi is None else (state.gi(event.gi),)
        gone, new = [], state
        for gi in gis:
            cis = gi.compute if event.ci is None else (gi.ci(event.ci),)
            for ci in cis:
                if busy(processes_on, gi.id, ci.id):
                    raise InUse(f"a process runs on compute instance {ci.id} of GPU instance {gi.id}")
                gone.append(f"gi={gi.id}/ci={ci.id}")
            new = _with_gi(new, replace(gi, compute=tuple(c for c in gi.compute if c not in cis)))
        if not gone and event.ci is None and event.gi is None:
            raise NotFound(f"{name} has no compute instances")
        return Outcome(new, f"MIG destroyed compute instance(s) {' '.join(gone) or 'none'}")
    if isinstance(event, DestroyGpuInstances):
        gis = state.instances if event.gi is None else (state.gi(event.gi),)
        if not gis and not event.compute:
            raise NotFound(f"{name} has no GPU instances")
        for gi in gis:
            if busy(processes_on, gi.id):
                raise InUse(f"a process runs on GPU instance {gi.id}")
            if gi.compute and not event.compute:
                raise InUse(f"GPU instance {gi.id} has compute instances; destroy them first")
        ids = {g.id for g in gis}
        new = replace(state, instances=tuple(g for g in state.instances if g.id not in ids))
        return Outcome(new, f"MIG destroyed GPU instance(s) {' '.join(f'gi={i}' for i in sorted(ids)) or 'none'}")
    raise InvalidCommand(f"unknown MIG event {event!r}")  # pragma: no cover


def _reply(created: list[tuple[int, int | None]]) -> str:
    return " ".join(f"gi={g}" if c is None else f"gi={g}/ci={c}" for g, c in created)


def _created_line(mig: Mig, state: MigState, created: list[tuple[int, int | None]], gis: bool) -> str:
    parts = []
    for g, c in created:
        gi = state.gi(g)
        gp = gi_profile_by_index(mig, gi.profile)
        if gis:
            parts.append(f"gi={g} {gp.name} at {gi.start}:{gi.size}{'' if c is None else f' with ci={c}'}")
        else:
            ci = gi.ci(c)
            parts.append(f"gi={g}/ci={c} {ci_profile(gp, ci.profile).name} at {ci.start}:{ci.size}")
    return f"MIG created {', '.join(parts)}"


# --- the vocabulary's spelling ----------------------------------------------------------------------

_REF = r"(?:[0-9]+|[0-9a-z][0-9a-z.+]{0,31})"  # an id (the number rule) or a name


def _requests(text: str) -> tuple[Request, ...]:
    """`3g.40gb,2g.20gb,19:6`: profiles by name or id, each with an optional `:START`."""
    out = []
    for item in text.split(","):
        m = re.fullmatch(rf"({_REF})(?::([0-9]+))?", item)
        if not m:
            raise InvalidCommand(f"expected PROFILE[:START], got {item[:40]!r}")
        ref = whole_number(m.group(1), "profile", 0xFF) if m.group(1).isdigit() else m.group(1)
        out.append((ref, None if m.group(2) is None else whole_number(m.group(2), "placement start", 0xFF)))
    return _check_requests(tuple(out))


def _instance_id(word: str, what: str, allow_all: bool) -> int | None:
    if allow_all and word == "all":
        return None
    if not re.fullmatch(r"[0-9]+", word):
        raise InvalidCommand(f"{what} must be an id{' or all' if allow_all else ''}, got {word[:20]!r}")
    return whole_number(word, what, 0xFF)


USAGE = "enable|disable, create LIST, create_gi LIST, create_ci GI LIST, destroy_ci GI|all CI|all, destroy_gi GI|all, clear"


def parse(i: int, text: str) -> MigEvent:
    """The `mig` verb's arguments (docs/mig.md):
        enable | disable                 nvidia-smi -mig 1|0
        create LIST                      -cgi LIST -C (each with its full-size compute instance)
        create_gi LIST                   -cgi LIST
        create_ci GI LIST                -gi GI -cci LIST
        destroy_ci GI|all CI|all         -gi GI -ci CI -dci
        destroy_gi GI|all                -gi GI -dgi
        clear                            every compute instance, then every GPU instance
    LIST is `PROFILE[:START],...`, a profile by name (`3g.40gb`, `1c.3g.40gb`) or id (`9`)."""
    words = text.split(" ")
    verb, args = words[0], words[1:]
    shapes = {"enable": 0, "disable": 0, "create": 1, "create_gi": 1, "create_ci": 2,
              "destroy_ci": 2, "destroy_gi": 1, "clear": 0}
    if verb not in shapes:
        raise InvalidCommand(f"expected one of: {USAGE}")
    if len(args) != shapes[verb]:
        raise InvalidCommand(f"mig {verb} takes {shapes[verb]} argument(s); usage: {USAGE}")
    if verb in ("enable", "disable"):
        return SetMigMode(i, verb == "enable")
    if verb in ("create", "create_gi"):
        return CreateGpuInstances(i, _requests(args[0]), default_ci=verb == "create")
    if verb == "create_ci":
        return CreateComputeInstances(i, _instance_id(args[0], "GPU instance", False), _requests(args[1]))
    if verb == "destroy_ci":
        return DestroyComputeInstances(i, _instance_id(args[0], "GPU instance", True),
                                       _instance_id(args[1], "compute instance", True))
    if verb == "destroy_gi":
        return DestroyGpuInstances(i, _instance_id(args[0], "GPU instance", True))
    return DestroyGpuInstances(i, None, compute=True)


# --- what every surface shows -----------------------------------------------------------------------


@dataclass(frozen=True)
class GpuInstanceView:
    """A GPU instance with its profile's facts, as NVML, nvidia-smi and the capability files
    report it."""

    id: int
    profile: MigGpuProfile
    start: int
    size: int
    minor: int  # nvidia-caps minor of gpu<minor>/gi<id>/access
    memory_used_bytes: int  # its idle bytes and what the processes on it use
    compute: tuple[ComputeInstance, ...]
    remaining: tuple[int, ...]  # compute instances of each compute profile (table order) that still fit
    bar1_bytes: int  # its BAR1 aperture (bar1_bytes below)


@dataclass(frozen=True)
class MigDevice:
    """A compute instance: one MIG device, what CUDA and NVML's MIG handles stand for. Its index
    among the GPU's MIG devices is its place in (GPU instance id, compute instance id) order."""

    gi: GpuInstanceView
    ci: ComputeInstance
    profile: MigComputeProfile
    name: str  # NVML's device name
    uuid: str  # MIG-...
    minor: int  # nvidia-caps minor of gpu<minor>/gi<gi>/ci<ci>/access

    @property
    def memory_total_bytes(self) -> int:
        return self.gi.profile.memory_mib << 20  # compute instances share their GPU instance's memory


# BAR1 in MIG mode (docs/mig.md, "BAR1"). From the 580 branch the driver maps the GPU's usable
# framebuffer (total less reserved) into BAR1 when MIG is on, and each GPU instance is given its
# memory slices' share of what is left, less 513 MiB, in eighths rounded down: the real 590 H100
# (49992 MiB left: 24739, 12369, 6184 MiB for 4, 2 and 1 slices) and H200 at 580, 590 and 610
# (59238, 59237/29618/14809, 59241) all give exactly this. Before 580 (a real H100 NVL at
# 560.35.03, A100 80GB tables) an instance's share is of the whole aperture, less 1 MiB.
SHARED_BAR1_BRANCH = 580
SHARED_BAR1_HELD_MIB = 513


def mig_bar1_used_mib(profile: GpuProfile, branch: int) -> int:
    """The GPU's own BAR1 used while MIG mode is on: its usable framebuffer from the 580 branch
    (a real H200 at 580, 590 and 610: 143155, 143157, 143148 MiB = total less that run's
    reserved), the idle board's mapping before (no MIG-mode capture of an older branch found)."""
    m = profile.memory
    return m.total_mib - m.reserved_mib if branch >= SHARED_BAR1_BRANCH else m.bar1_used_mib


def bar1_bytes(profile: GpuProfile, size: int, branch: int) -> int:
    """A GPU instance's BAR1 (its MIG devices' `Shared BAR1 Memory` Total) for `size` memory
    slices under driver branch `branch` (the rule above)."""
    m, slices = profile.memory, tables(profile).memory_slices
    if branch >= SHARED_BAR1_BRANCH:
        left = m.bar1_mib - mig_bar1_used_mib(profile, branch) - SHARED_BAR1_HELD_MIB
        return max(left, 0) * size // slices << 20
    return max(m.bar1_mib * size // slices - 1, 0) << 20


# What a GPU instance holds with nothing running on it: a few MiB per compute slice (a real
# H100 at 590: 9, 17 and 26 MiB on its 1g, 2g and 3g instances at idle), so (26 x slices) / 3,
# rounded down after adding 1: 9, 17, 26, 35, 61 MiB for 1, 2, 3, 4, 7 slices.
IDLE_MIB_PER_THREE_SLICES = 26


def idle_bytes(gp: MigGpuProfile) -> int:
    """The memory a GPU instance of `gp` shows used at idle (counted to the GPU's used too)."""
    return (IDLE_MIB_PER_THREE_SLICES * gp.slices + 1) // 3 << 20


def describe(profile: GpuProfile, gpu_uuid: str, gpu_minor: int, instances: tuple[GpuInstance, ...],
             used_by_gi: dict[int, int], branch: int) -> tuple[tuple[GpuInstanceView, ...], tuple[MigDevice, ...]]:
    """The GPU instances and MIG devices of `instances` (what `Node.mig_instances` lists), with
    every fact a surface reports, computed once here. `used_by_gi`: bytes in use per GPU instance
    (its idle bytes included); `branch`: the driver's, which decides the BAR1 rule."""
    if not instances:
        return (), ()
    mig = tables(profile)
    gis, devices = [], []
    for g in instances:
        gp = gi_profile_by_index(mig, g.profile)
        remaining = tuple(remaining_compute_instances(gp, g, cp) for cp in gp.compute_profiles)
        view = GpuInstanceView(g.id, gp, g.start, g.size, caps_minor(gpu_minor, g.id), used_by_gi.get(g.id, 0),
                               g.compute, remaining, bar1_bytes(profile, g.size, branch))
        gis.append(view)
        for c in g.compute:
            cp = ci_profile(gp, c.profile)
            devices.append(MigDevice(view, c, cp, device_name(profile.product_name, gp, cp),
                                     mig_uuid(gpu_uuid, g.id, c.id), caps_minor(gpu_minor, g.id, c.id)))
    return tuple(gis), tuple(devices)
