"""Every MIG-capable board's GPU- and compute-instance tables are internally
consistent: the slices add up, every placement fits, every layout the placements allow fits the
board, and the instance counts are exactly what the placements and the engines allow.

The rules asserted here were checked against the real tables first (`nvidia-smi mig -lgip`,
`-lgipp` and `-lcip` of A100, H100, H200, B200 and GB200; docs/profiles.md, "MIG tables"), so a
table that breaks one is a typo, not a new board. Each checker returns the problems it finds, and
is also run on a doctored copy of a real table to show it can fail.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from mokkafs.model.schema import GpuProfile, Mig, MigGpuProfile, ProfileError, coexisting_placements
from mokkafs.model.profiles import available_profiles, load_profile, load_profile_file

pytestmark = pytest.mark.level("model")

PROFILES = {name: load_profile(name) for name in available_profiles()}
MIG_BOARDS = sorted(n for n, p in PROFILES.items() if p.mig_capable)

# NVML_GPU_INSTANCE_PROFILE_* by shape, and the id the driver reports for each (the ID column of
# every real `mig -lgip`: A100, H100, H200, B200, GB200 all agree).
GI_ENUM = {"1g": 0, "1g+me": 7, "1g.2slices": 9, "2g": 1, "3g": 2, "4g": 3, "7g": 4}
GI_REPORTED_ID = {0: 19, 7: 20, 9: 15, 1: 14, 2: 9, 3: 5, 4: 0}
# NVML_COMPUTE_INSTANCE_PROFILE_* by compute slices (real `mig -lcip`: 1c=0, 2c=1, 3g=2, 4g=3).
CI_ENUM = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
ENGINES = ("copy_engines", "decoders", "encoders", "jpegs", "ofas")
NAME = re.compile(r"^(?P<g>\d)g\.(?P<gb>\d+)gb(?P<me>\+me)?$")


def _full(mig: Mig) -> MigGpuProfile:
    return next(g for g in mig.gpu_instance_profiles
                if g.slices == mig.compute_slices and g.placement_size == mig.memory_slices)


def _shape(g: MigGpuProfile) -> str:
    if g.slices == 1:
        if g.name.endswith("+me"):
            return "1g+me"
        return "1g" if g.placement_size == 1 else "1g.2slices"
    return f"{g.slices}g"


def _layouts(mig: Mig):
    """Every set of GPU instances whose placements do not overlap (the empty set too), each
    profile at most `instances` times: all the layouts the placement tables allow."""
    items = [(g, p) for g in mig.gpu_instance_profiles for p in g.placements]

    def grow(start: int, used: frozenset[int], counts: dict[str, int], chosen: list):
        yield list(chosen)
        for i in range(start, len(items)):
            g, p = items[i]
            span = frozenset(range(p, p + g.placement_size))
            if span & used or counts.get(g.name, 0) == g.instances:
                continue
            chosen.append((g, p))
            counts[g.name] = counts.get(g.name, 0) + 1
            yield from grow(i + 1, used | span, counts, chosen)
            counts[g.name] -= 1
            chosen.pop()

    yield from grow(0, frozenset(), {}, [])


def size_problems(board: GpuProfile) -> list[str]:
    """The whole-GPU profile takes every slice; the 1-slice profile fills the compute slices
    within the board's SMs; no profile has more of anything than the whole GPU."""
    mig, out = board.mig, []
    full = _full(mig)
    if full.sm > board.sm_count or full.memory_mib > board.memory.total_mib:
        out.append(f"{full.name} has more SMs or memory than the board")
    base = next(g for g in mig.gpu_instance_profiles if _shape(g) == "1g")
    if base.instances != mig.compute_slices:
        out.append(f"{base.name}: {base.instances} instances, the GPU has {mig.compute_slices} compute slices")
    if base.instances * base.sm > board.sm_count:
        out.append(f"{base.instances} x {base.name} take {base.instances * base.sm} SMs of {board.sm_count}")
    for g in mig.gpu_instance_profiles:
        for key in ("sm", "memory_mib", *ENGINES):
            if getattr(g, key) > getattr(full, key):
                out.append(f"{g.name} has more {key} than the whole-GPU profile {full.name}")
    return out


def layout_problems(board: GpuProfile) -> list[str]:
    """Every layout of non-overlapping placements fits the board's memory, SMs and compute
    slices (a placement table that allowed more would let a model over-commit the GPU)."""
    mig, out, seen = board.mig, [], 0
    full = _full(mig)
    for layout in _layouts(mig):
        seen += 1
        names = "+".join(f"{g.name}@{p}" for g, p in layout)
        if sum(g.memory_mib for g, _ in layout) > board.memory.total_mib:
            out.append(f"{names} needs more memory than the board's {board.memory.total_mib} MiB")
        if sum(g.sm for g, _ in layout) > full.sm:
            out.append(f"{names} needs more SMs than the whole GPU's {full.sm}")
        if sum(g.slices for g, _ in layout) > mig.compute_slices:
            out.append(f"{names} needs more than {mig.compute_slices} compute slices")
    if seen < 2:
        out.append("no layout was enumerated")
    return out


def instance_problems(board: GpuProfile) -> list[str]:
    """instanceCount on an empty GPU is what the placements allow at once, further limited by
    the engines: the whole-GPU profile owns all of them, so a profile taking e OFAs fits
    total/e times (one `+me` profile, because the GPU has one OFA)."""
    mig, out = board.mig, []
    full = _full(mig)
    for g in mig.gpu_instance_profiles:
        limits = [coexisting_placements(g.placements, g.placement_size)]
        limits += [getattr(full, e) // getattr(g, e) for e in ENGINES if getattr(g, e)]
        if g.instances != min(limits):
            out.append(f"{g.name}: {g.instances} instances, placements and engines allow {min(limits)}")
    return out


def naming_problems(board: GpuProfile) -> list[str]:
    """Names, NVML enums and reported ids agree with each profile's shape; profiles spanning the
    same memory slices have the same memory, and the name's size is that memory, give or take
    the 10% by which every real table's nominal sizes differ from memorySizeMB."""
    mig, out = board.mig, []
    by_span: dict[int, int] = {}
    for g in mig.gpu_instance_profiles:
        m = NAME.match(g.name)
        shape = _shape(g)
        if not m or int(m["g"]) != g.slices:
            out.append(f"{g.name}: the name does not say {g.slices} slices")
            continue
        if bool(m["me"]) != (shape == "1g+me") or bool(m["me"]) != (g.ofas > 0 and g.slices == 1):
            out.append(f"{g.name}: +me goes with the 1-slice profile that has the OFA")
        if g.profile != GI_ENUM.get(shape) or g.id != GI_REPORTED_ID.get(g.profile):
            out.append(f"{g.name}: profile {g.profile} / id {g.id}, a {shape} is {GI_ENUM.get(shape)} / "
                       f"{GI_REPORTED_ID.get(GI_ENUM.get(shape))}")
        if abs(int(m["gb"]) - g.memory_mib * 2**20 / 1e9) > 0.1 * int(m["gb"]):
            out.append(f"{g.name}: {g.memory_mib} MiB is not about {m['gb']} GB")
        if by_span.setdefault(g.placement_size, g.memory_mib) != g.memory_mib:
            out.append(f"{g.name}: profiles spanning {g.placement_size} memory slices differ in memory")
    return out


def compute_problems(board: GpuProfile) -> list[str]:
    """Each GPU instance's compute-instance table: NVML enum by slices, `<k>c.<gi>` names, instance
    counts the placements allow, a full 1c layout fills the instance, SMs grow with slices."""
    mig, out = board.mig, []
    base_sm = next(g.sm for g in mig.gpu_instance_profiles if _shape(g) == "1g")
    for g in mig.gpu_instance_profiles:
        cis = sorted(g.compute_profiles, key=lambda ci: ci.slices)
        for ci in cis:
            want = g.name if ci.slices == g.slices else f"{ci.slices}c.{g.name}"
            if ci.name != want or ci.profile != CI_ENUM.get(ci.slices):
                out.append(f"{g.name}/{ci.name}: want {want}, profile {CI_ENUM.get(ci.slices)}")
            # as many as fit side by side and within the instance's compute slices (a 3g
            # instance's 2c may sit at 0:2 or 2:2, but two would need 4 slices)
            if ci.instances != min(coexisting_placements(ci.placements, ci.slices), g.slices // ci.slices):
                out.append(f"{g.name}/{ci.name}: {ci.instances} instances, the placements allow another count")
            if ci.instances * ci.sm > g.sm:
                out.append(f"{g.name}/{ci.name}: {ci.instances} x {ci.sm} SMs exceed the instance's {g.sm}")
        # a 1-slice instance has only its full-size profile (real -lcip), which has all its SMs
        one_c_sm = g.sm if g.slices == 1 else base_sm
        if cis[0].slices != 1 or cis[0].instances != g.slices or cis[0].sm != one_c_sm:
            out.append(f"{g.name}: its 1c profile fills all {g.slices} slices with {one_c_sm} SMs each")
        if any(a.sm >= b.sm for a, b in zip(cis, cis[1:])):
            out.append(f"{g.name}: compute profiles' SMs do not grow with their slices")
    return out


CHECKS = [size_problems, layout_problems, instance_problems, naming_problems, compute_problems]


def test_mig_capable_boards_are_the_ones_with_tables():
    assert MIG_BOARDS == ["a100", "a100-80gb", "b200", "gb200", "gb300", "h100", "h100-nvl", "h200"]
    for name, p in PROFILES.items():
        assert (p.mig is not None) == p.mig_capable, name
    assert PROFILES["l40s"].mig is None and PROFILES["t4"].mig is None


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("board", MIG_BOARDS)
def test_table_is_consistent(board, check):
    assert check(PROFILES[board]) == []


def test_every_board_lists_the_same_seven_profile_shapes():
    for name in MIG_BOARDS:
        shapes = sorted(_shape(g) for g in PROFILES[name].mig.gpu_instance_profiles)
        assert shapes == sorted(GI_ENUM), name


def test_layout_enumeration_finds_the_real_maximal_layouts():
    mig = PROFILES["h100"].mig
    layouts = {tuple(sorted((g.name, p) for g, p in lay)) for lay in _layouts(mig)}
    # the user guide's H100 layouts: 4g+3g, 3g+2g+1g+1g, seven 1g, four 1g.20gb
    assert (("3g.40gb", 4), ("4g.40gb", 0)) in layouts
    assert (("1g.10gb", 2), ("1g.10gb", 3), ("2g.20gb", 0), ("3g.40gb", 4)) in layouts
    assert tuple(("1g.10gb", p) for p in range(7)) in layouts
    assert (("1g.20gb", 0), ("1g.20gb", 2), ("1g.20gb", 4), ("1g.20gb", 6)) in layouts
    assert (("3g.40gb", 0), ("4g.40gb", 0)) not in layouts  # they overlap


def _doctor(board: str, profile_name: str, **changes) -> GpuProfile:
    """A real board with one GPU-instance profile edited, skipping validation (as a hand-edited
    table that the schema alone cannot see through)."""
    p = PROFILES[board]
    gis = tuple(g.model_copy(update=changes) if g.name == profile_name else g
                for g in p.mig.gpu_instance_profiles)
    return p.model_copy(update={"mig": p.mig.model_copy(update={"gpu_instance_profiles": gis})})


@pytest.mark.parametrize("check, board, profile, changes, needle", [
    (layout_problems, "h100", "1g.20gb", {"memory_mib": 30000}, "needs more memory"),
    (layout_problems, "b200", "2g.45gb", {"sm": 60}, "needs more SMs"),
    (instance_problems, "h100", "1g.10gb+me", {"instances": 2}, "placements and engines allow 1"),
    (instance_problems, "a100", "3g.20gb", {"decoders": 3}, "placements and engines allow 1"),
    (naming_problems, "h200", "3g.71gb", {"memory_mib": 33024}, "is not about 71 GB"),
    (naming_problems, "gb200", "2g.47gb", {"id": 15}, "profile 1 / id 15"),
    (size_problems, "a100", "1g.5gb", {"sm": 16}, "7 x 1g.5gb take 112 SMs of 108"),
    (compute_problems, "h100", "4g.40gb", {"sm": 40}, "exceed the instance's 40"),
])
def test_checks_catch_a_doctored_table(check, board, profile, changes, needle):
    problems = check(_doctor(board, profile, **changes))
    assert any(needle in p for p in problems), problems


def _broken_copy(tmp_path: Path, edit) -> Path:
    raw = yaml.safe_load((Path(__file__).parents[1] / "profiles" / "h100.yaml").read_text())
    edit(raw)
    path = tmp_path / "h100-broken.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _gi(raw: dict, name: str) -> dict:
    return next(g for g in raw["mig"]["gpu_instance_profiles"] if g["name"] == name)


@pytest.mark.parametrize("edit, key, needle", [
    (lambda r: _gi(r, "1g.20gb").update(placements=[0, 2, 4, 7]), "mig:",
     "a placement of 1g.20gb runs past the GPU's memory slices"),
    (lambda r: _gi(r, "3g.40gb").update(instances=3), "mig.gpu_instance_profiles.4:",
     "instances is more than there are placements that can be used at once"),
    (lambda r: _gi(r, "3g.40gb")["compute_profiles"][-1].update(sm=61), "mig.gpu_instance_profiles.4:",
     "the full-size compute profile of 3g.40gb carries its name and SMs"),
    (lambda r: _gi(r, "2g.20gb")["compute_profiles"][0].update(instances=3),
     "mig.gpu_instance_profiles.3.compute_profiles.0:", "instances is more than there are placements"),
    (lambda r: _gi(r, "1g.10gb").update(sms=16), "mig.gpu_instance_profiles.0.sms:", "unknown key"),
    (lambda r: _gi(r, "1g.10gb+me").update(id=19), "mig:", "GPU instance profile id 19 is listed twice"),
    (lambda r: _gi(r, "7g.80gb").update(placement_size=7), "mig:", "no GPU instance profile takes the whole GPU"),
    (lambda r: r.update(mig_capable=False), "(top level):", "mig tables are given only when mig_capable is true"),
])
def test_broken_table_is_refused_naming_the_key(tmp_path, edit, key, needle):
    path = _broken_copy(tmp_path, edit)
    with pytest.raises(ProfileError) as err:
        load_profile_file(path)
    msg = str(err.value)
    assert str(path) in msg and key in msg and needle in msg, msg


def test_unbroken_copy_loads(tmp_path):
    # the round trip itself is not what the broken-table tests catch
    assert load_profile_file(_broken_copy(tmp_path, lambda r: None)) == PROFILES["h100"]
