"""Node compositions (compositions/*.yaml): the board apart from the machine it sits in.

Levels: model and renderers (whole trees rendered without mounting, the shims' state records),
Debian's lspci on a rendered copy, and one real mount with `mokka mount --node` read by our
nvidia-smi and by lspci under `mokka run`.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import MountedNode, force_unmount, mokka_cmd
from helpers_nvml import consumer_env
from helpers_vfs import dump
from mokkafs.model import Node, compose
from mokkafs.model.schema import MAX_GPUS, Composition, ProfileError
from mokkafs.model.profiles import available_compositions, available_profiles, load_composition, load_profile, load_profile_file

pytestmark = pytest.mark.level("render")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gen_render_digests as digests  # noqa: E402

NODE_SECTION_PROFILES = Path(__file__).parent / "fixtures" / "node_section_profiles"
DOCS = ROOT / "docs" / "profiles.md"
SHIPPED_COMPOSITIONS = ["gb200-nvl4", "gb300-nvl4", "hgx-8", "hgx-a100-8", "hgx-b200-8", "pcie-4", "pcie-8",
                        "workstation-1"]


def all_digests(config) -> dict[str, str]:
    node = Node(config, digests.BORN)
    return {**digests.tree_digests(node), **digests.state_digests(node)}


def differing(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The keys that differ, and the state record (`state/gpu3`, `state/mig_tables`) of each field
    that does."""
    keys = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    return sorted(keys | {k.split(".")[0] for k in keys if k.startswith("state/") and "." in k})


# --- the split changed nothing -------------------------------------------------------------------


@pytest.fixture(scope="module")
def before() -> dict[str, dict[str, str]]:
    return digests.load_fixture()


@pytest.mark.parametrize("profile", digests.PROFILES)
def test_every_shipped_profile_renders_as_before_the_split(before, profile):
    """The whole tree (sys/, proc/, dev/, node/, gpuN/, ib/, driver/) and every state record the
    shims read (nvidia-smi -q -x, NVML, libcuda), line by line, against what the code before
    compositions rendered (tests/fixtures/render/<profile>.txt, scripts/gen_render_digests.py)."""
    after = digests.digests(profile)
    assert len(before[profile]) > 200
    assert differing(before[profile], after) == []


@pytest.mark.parametrize("profile", digests.PROFILES)
def test_the_node_section_and_the_named_composition_render_alike(profile):
    """Each shipped profile as it was written before compositions (a `node:` section, no
    `composition` key) still loads, and renders byte for byte as the shipped profile that names
    its composition instead."""
    old = load_profile_file(NODE_SECTION_PROFILES / f"{profile}.yaml")
    new = load_profile(profile)
    assert old.composition is None and new.composition is not None
    assert "node" not in yaml.safe_load((ROOT / "profiles" / f"{profile}.yaml").read_text())
    assert old.node == new.node
    a = all_digests(compose(old, hostname=digests.HOSTNAME))
    b = all_digests(compose(new, hostname=digests.HOSTNAME))
    # A node: section names no system, so its DMI names the derived composition (sys/class/dmi).
    assert [k for k in differing(a, b) if not k.startswith("sys/class/dmi")] == []


def test_the_fixture_sees_a_change_of_composition():
    """The digests are fine enough to catch one GPU moved to the other NUMA node."""
    profile = load_profile("h100")
    base = profile.default_composition()
    slots = list(base.layout())
    slots[3] = slots[3].model_copy(update={"numa": 1})
    moved = base.model_copy(update={"slots": tuple(slots)})
    a = all_digests(compose(profile, hostname=digests.HOSTNAME))
    b = all_digests(compose(profile, node=moved, hostname=digests.HOSTNAME))
    changed = differing(a, b)
    assert "gpu3/info" in changed and "state/gpu3" in changed and "state/gpu0" in changed  # topo levels
    assert "gpu2/info" not in changed


# --- shipped compositions ------------------------------------------------------------------------


def test_shipped_compositions_load_and_are_documented():
    assert available_compositions() == SHIPPED_COMPOSITIONS
    docs = DOCS.read_text()
    section = docs.split("## Node compositions", 1)[1]
    for name in SHIPPED_COMPOSITIONS:
        c = load_composition(name)
        assert c.name == name
        assert c.slots is not None and len(c.slots) == c.gpus  # every shipped one lists its bus layout
        assert f"`{name}`" in section, f"{name} has no source in docs/profiles.md"


def test_every_profile_names_a_shipped_composition_it_fits():
    for name in available_profiles():
        p = load_profile(name)
        if p.composition is not None:  # profiles written in the node: format derive theirs
            assert p.composition.name in SHIPPED_COMPOSITIONS
        compose(p)  # fits


@pytest.mark.parametrize("profile,node", [("h100", "hgx-8"), ("h200", "hgx-8"), ("a100", "hgx-a100-8"),
                                          ("b200", "hgx-b200-8"), ("gb200", "gb200-nvl4"), ("gb300", "gb300-nvl4"),
                                          ("l40s", "pcie-4"), ("l40s", "pcie-8"), ("t4", "workstation-1"),
                                          ("h100", "pcie-8"), ("t4", "pcie-4")])
def test_boards_in_compositions(profile, node):
    config = compose(load_profile(profile), node=node)
    n = Node(config, digests.BORN)
    c = load_composition(node)
    assert len(n.gpus) == c.gpus
    assert [i.bdf.bus for i in n.identities] == [s.bus for s in c.slots]
    assert [i.numa_node for i in n.identities] == [s.numa for s in c.slots]


# --- h100 in a PCIe 4-GPU server: what changes, and nothing else ---------------------------------


@pytest.fixture(scope="module")
def hgx_and_pcie():
    p = load_profile("h100")
    return (Node(compose(p, hostname="same"), digests.BORN), Node(compose(p, node="pcie-4", hostname="same"), digests.BORN))


def test_pcie4_differs_from_hgx8_only_in_its_layout_keys():
    a, b = load_composition("hgx-8"), load_composition("pcie-4")
    differ = {k for k in Composition.model_fields if getattr(a, k) != getattr(b, k)}
    assert differ == {"name", "description", "gpus", "slots", "nvswitches", "nvswitch_device_id", "hcas", "hca", "system"}


def test_h100_in_pcie4_changes_count_bus_numa_switches_and_topology(hgx_and_pcie):
    hgx, pcie = hgx_and_pcie
    assert len(hgx.gpus) == 8 and len(pcie.gpus) == 4
    assert [i.bdf.sysfs for i in pcie.identities] == ["0000:18:00.0", "0000:1e:00.0", "0000:24:00.0", "0000:2a:00.0"]
    assert [i.numa_node for i in hgx.identities[:4]] == [0, 0, 0, 0]
    assert [i.numa_node for i in pcie.identities] == [0, 0, 1, 1]
    kinds = lambda n: sorted({f.kind for f in n.layout.functions})  # noqa: E731
    assert "nvswitch" in kinds(hgx) and "hca" in kinds(hgx)
    assert "nvswitch" not in kinds(pcie) and "hca" not in kinds(pcie)
    # NVLinks: to the 4 NVSwitches on HGX; to the bridged peer (0-1, 2-3) in the PCIe server
    assert {r.kind for r in hgx.layout.nvlinks[0]} == {"switch"}
    peer = {i.index: i.bdf for i in pcie.identities}
    assert {(r.kind, r.bdf) for r in pcie.layout.nvlinks[2]} == {("gpu", peer[3])}
    # topo -m levels: one NUMA node apart is SYS, within a node NODE (each GPU has its own root complex)
    assert pcie.layout.levels[0] == (0, 40, 50, 50) and hgx.layout.levels[0][:4] == (0, 40, 40, 40)
    # the CPUs local to GPU 2 are the second socket's
    assert pcie.layout.gpu_cpus(2) == hgx.layout.gpu_cpus(4)


def test_h100_in_pcie4_keeps_every_board_fact(hgx_and_pcie):
    """GPUs 0-3 publish the same records except where the composition decides: the NUMA node,
    CPU affinity, NVLink far ends and topology levels. Name, UUID, serial, memory, clocks, power
    and thermal limits, VBIOS, bus id, MIG tables and the driver are the board's or unchanged."""
    from mokkafs.daemon.shm.layout import ffi
    from mokkafs.daemon.shm.publisher import fill_gpu

    hgx, pcie = hgx_and_pcie
    t = ffi.typeof("struct mokka_gpu")
    for i in range(4):
        recs = []
        for node in (hgx, pcie):
            g = ffi.new("struct mokka_gpu *")
            fill_gpu(g[0], node, i, digests.NOW)
            recs.append(bytes(ffi.buffer(g)))
        changed = {name for name, f in t.fields
                   if recs[0][f.offset:f.offset + ffi.sizeof(f.type)] != recs[1][f.offset:f.offset + ffi.sizeof(f.type)]}
        assert changed <= {"numa_node", "cpu_affinity", "nvlink", "topo_level"}, (i, changed)
        assert "nvlink" in changed and "topo_level" in changed
    assert "state/mig_tables" not in differing(digests.state_digests(hgx), digests.state_digests(pcie))
    assert hgx.config.driver_version == pcie.config.driver_version


# Every file both trees have that differs must be one the layout owns.
LAYOUT_OWNED = re.compile(
    r"(\.|node/gpu_count|gpu[23]/info|dev|sys/(bus|class|devices|module)(/.*)?|(driver/)?dev"
    r"|(driver/)?proc/(devices|modules|driver/nvidia/gpus(/[0-9a-f:.]+/information)?))$")


def test_h100_in_pcie4_changes_no_other_file(hgx_and_pcie):
    from mokkafs.render.tree import root
    from mokkafs.render.vfs import Ctx, Tree

    hgx, pcie = hgx_and_pcie
    a, b = digests.tree_digests(hgx), digests.tree_digests(pcie)
    changed = [k for k in a.keys() & b.keys() if a[k] != b[k]]
    assert changed and [k for k in changed if not LAYOUT_OWNED.match(k)] == []
    # gpuN/info: only the NUMA line; the driver's information file: only the IRQ (probe order)
    for path, line in (("gpu2/info", "numa_node:"), ("proc/driver/nvidia/gpus/0000:18:00.0/information", "IRQ:")):
        old, new = (Tree(root(n.config)).resolve(path, Ctx(n, digests.NOW)).read(Ctx(n, digests.NOW)).decode()
                    for n in (hgx, pcie))
        diff = [(x, y) for x, y in zip(old.splitlines(), new.splitlines()) if x != y]
        assert len(diff) == 1 and diff[0][0].startswith(line), diff
    # what only the HGX node has: GPUs 4-7, the NVSwitches, the HCAs and their ib/ controls
    gone = a.keys() - b.keys()
    assert any(k.startswith("gpu7/") for k in gone) and any(k.startswith("ib/") for k in gone)
    assert not b.keys() - a.keys() - {k for k in b if LAYOUT_OWNED.match(k)}


@pytest.mark.level("tools")
def test_real_lspci_reads_a_composition_with_its_own_bus_layout(tmp_path):
    """pcie-8 lists its buses (two root-complex groups, an HCA beside every other GPU)."""
    node = Node(compose(load_profile("l40s"), node="pcie-8"), digests.BORN)
    dump(node, "sys", tmp_path / "sys")
    listing = subprocess.run(["lspci", "-A", "linux-sysfs", "-O", f"sysfs.path={tmp_path}/sys/bus/pci", "-nn"],
                             capture_output=True, text=True, check=True).stdout
    gpus = [line.split()[0] for line in listing.splitlines() if "[10de:26b9]" in line]
    assert gpus == ["18:00.0", "1e:00.0", "24:00.0", "2a:00.0", "98:00.0", "9e:00.0", "a4:00.0", "aa:00.0"]
    hcas = [line.split()[0] for line in listing.splitlines() if "[15b3:1021]" in line]
    assert hcas == ["19:00.0", "25:00.0", "99:00.0", "a5:00.0"]


# --- overrides -----------------------------------------------------------------------------------


def test_count_overrides_lay_out_by_the_default_rule():
    p = load_profile("h100")
    c = compose(p, node="pcie-8", gpus=2)
    assert [(s.bus, s.numa) for s in c.slots] == [(0x18, 0), (0x1e, 1)]
    assert compose(p, node="pcie-8").slots[4].bus == 0x98  # its own layout when the count is its own
    assert compose(p, node="pcie-4", driver_version="550.90.12").driver_version == "550.90.12"


# --- refusals ------------------------------------------------------------------------------------


def write(tmp_path: Path, name: str, data: dict) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def composition_data(name: str = "pcie-4") -> dict:
    return yaml.safe_load((ROOT / "compositions" / f"{name}.yaml").read_text())


@pytest.mark.parametrize("profile,node,message", [
    ("l40s", "hgx-8", r"4 NVSwitches, but l40s \(NVIDIA L40S\) has no NVLink"),
    ("t4", "hgx-a100-8", r"6 NVSwitches, but t4 .* has no NVLink"),
    ("h100", "gb200-nvl4", r"composition gb200-nvl4 is a Grace \(aarch64\) tray; h100 .* is a board for x86 hosts"),
    ("gb200", "hgx-8", r"gb200 \(NVIDIA GB200\) is a Grace superchip's GPU; composition hgx-8 has x86_64 CPUs"),
    ("gb300", "pcie-4", r"Grace superchip's GPU"),
    ("gb200", "pcie-8", r"Grace superchip's GPU"),
    ("b200", "hgx-9", r"unknown composition 'hgx-9'; shipped compositions: gb200-nvl4, "),
])
def test_incompatible_combinations_are_refused(profile, node, message):
    with pytest.raises(ProfileError, match=message):
        compose(load_profile(profile), node=node)


def test_more_gpus_than_the_board_sits_per_node(tmp_path):
    data = composition_data("pcie-8")
    data.update(name="big", gpus=16, slots=None, hcas=0, hca=None)
    path = write(tmp_path, "big", data)
    with pytest.raises(ProfileError, match="composition big has 16 GPUs, but h100 boards sit at most 8 to a node"):
        compose(load_profile("h100"), node=path)
    with pytest.raises(ProfileError, match="gb200 boards sit at most 4"):
        compose(load_profile("gb200"), node=write(tmp_path, "g8", {**composition_data("gb200-nvl4"), "gpus": 8,
                                                                    "slots": None, "name": "g8"}))
    assert compose(load_profile("l40s"), node=path).gpus == 16  # a PCIe board has no such limit


def test_a_gpu_count_override_is_held_to_the_same_limit():
    """`--gpus N` lays out N GPUs of the board: no more than a composition of it could hold."""
    with pytest.raises(ProfileError, match=r"--gpus 9: h100 \(NVIDIA H100 80GB HBM3\) boards sit at most 8 to a node "
                                           r"\(the profile's max_gpus_per_node\)"):
        compose(load_profile("h100"), gpus=9)
    with pytest.raises(ProfileError, match=r"--gpus 5: gb200 .* at most 4 to a node"):
        compose(load_profile("gb200"), gpus=5)
    with pytest.raises(ProfileError, match="at most 8 to a node"):  # in any composition, not only its own
        compose(load_profile("h100"), node="pcie-4", gpus=12)
    assert compose(load_profile("h100"), gpus=8).gpus == 8 and compose(load_profile("gb200"), gpus=2).gpus == 2
    assert compose(load_profile("l40s"), gpus=16).gpus == 16  # a PCIe board has no such limit


def test_mount_refuses_more_gpus_than_the_board_sits_per_node(tmp_path):
    node = MountedNode(tmp_path, "b200")
    res = node.cli("mount", str(node.mnt), "--profile", "b200", "--gpus", "16", "--state-dir",
                   str(node.state_dir), check=False)
    assert res.returncode == 2
    assert "--gpus 16: b200 (NVIDIA B200) boards sit at most 8 to a node (the profile's max_gpus_per_node)" \
        in res.stderr
    assert not (node.mnt / "node").exists()  # nothing mounted


@pytest.mark.parametrize("change,message", [
    ({"gpus": MAX_GPUS + 1, "slots": None}, r"gpus: Input should be less than or equal to 64"),
    ({"gpuz": 4}, r"gpuz: unknown key; allowed keys here: cpu, cuda_version, description, driver_version, fabric, gpus"),
    ({"cpu": {"arch": "x86_64", "numa_nodes": 2, "cores_per_numa_node": 56, "threads_per_core": 2, "sockets": 2}},
     r"cpu.sockets: unknown key; allowed keys here: arch, cores_per_numa_node, model, numa_nodes, threads_per_core"),
    ({"cpu": {"arch": "x86_64", "numa_nodes": 8, "cores_per_numa_node": 128, "threads_per_core": 2}},
     r"cpu: Value error, 2048 CPUs: NVML's CPU masks carry at most 1024"),
    ({"gpus": 3}, r"\(top level\): Value error, slots lists 4 GPUs, gpus is 3"),
    ({"slots": [{"bus": 0x18, "numa": 0}, {"bus": 0x1e, "numa": 2}, {"bus": 0x24, "numa": 1},
                {"bus": 0x2a, "numa": 1}]}, r"slots.1.numa: 2, but cpu.numa_nodes is 2"),
    ({"slots": [{"bus": 0x18, "numa": 0}, {"bus": 0x1a, "numa": 0}, {"bus": 0x24, "numa": 1},
                {"bus": 0x2a, "numa": 1}]}, r"slots.1.bus: 0x1a needs buses 0x17-0x1a .* bus 0x17 is GPU 0's"),
    ({"slots": [{"bus": 0x18, "numa": 0, "hca": 0}, {"bus": 0x1e, "numa": 0}, {"bus": 0x24, "numa": 1},
                {"bus": 0x2a, "numa": 1}]}, r"slots.0.hca: HCA 0, but hcas is 0"),
    ({"slots": [{"bus": 0xd7, "numa": 0}, {"bus": 0x1e, "numa": 0}, {"bus": 0x24, "numa": 1},
                {"bus": 0x2a, "numa": 1}]}, r"slots.0.bus: Input should be less than 215"),
    ({"hcas": 2}, r"hcas > 0 needs an hca model"),
    ({"driver_version": "latest"}, r"driver_version: Value error, driver_version must look like 580.105.08"),
])
def test_bad_composition_files_name_the_file_and_key(tmp_path, change, message):
    path = write(tmp_path, "bad", {**composition_data(), **change})
    with pytest.raises(ProfileError) as err:
        load_composition(path)
    assert str(err.value).startswith(f"{path}: invalid composition: ") and "\n" not in str(err.value)
    assert re.search(message, str(err.value)), str(err.value)


def test_unreadable_and_non_mapping_composition_files(tmp_path):
    with pytest.raises(ProfileError, match=r"nope.yaml: cannot read composition"):
        load_composition(str(tmp_path / "nope.yaml"))
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ProfileError, match=r"list.yaml: a composition must be a mapping of keys, got list"):
        load_composition(str(tmp_path / "list.yaml"))
    (tmp_path / "bad.yaml").write_text("gpus: [\n")
    with pytest.raises(ProfileError, match=r"bad.yaml: not valid YAML"):
        load_composition(str(tmp_path / "bad.yaml"))


def test_a_profile_naming_a_missing_composition_says_so(tmp_path):
    data = yaml.safe_load((ROOT / "profiles" / "h100.yaml").read_text())
    data["composition"] = "hgx-80"
    with pytest.raises(ProfileError, match=r"h100.yaml: invalid profile: composition: Value error, unknown "
                                           r"composition 'hgx-80'"):
        load_profile_file(Path(write(tmp_path, "h100", data)))
    data["composition"] = str(ROOT / "compositions" / "hgx-8.yaml")  # a profile names shipped ones only
    with pytest.raises(ProfileError, match=r"composition: Value error, unknown composition '/"):
        load_profile_file(Path(write(tmp_path, "h100", data)))


# --- the command line ----------------------------------------------------------------------------


@pytest.mark.level("mount")
def test_mount_with_node_pcie4_on_h100(tmp_path):
    """`mokka mount --profile h100 --node pcie-4`: our nvidia-smi and lspci (under `mokka run`)
    see four GPUs on the composition's buses, NV-bridged pairs, the sockets apart and no NVSwitch."""
    node = MountedNode(tmp_path, "h100")
    node.mount(("--node", "pcie-4"))
    try:
        env = consumer_env(node.state_dir / "state")
        smi = str(node.path("driver/usr/bin/nvidia-smi"))
        listing = subprocess.run([smi, "-L"], env=env, capture_output=True, text=True, check=True, timeout=20).stdout
        topo = subprocess.run([smi, "topo", "-m"], env=env, capture_output=True, text=True, check=True,
                              timeout=20).stdout.splitlines()
        lspci = subprocess.run([*mokka_cmd(), "run", "--root", str(node.mnt), "--", "lspci", "-nn"], env=node.env,
                               capture_output=True, text=True, timeout=60, check=True).stdout
        assert node.read("node/gpu_count") == "4\n"
    finally:
        node.umount()
        force_unmount(node.mnt)
    assert listing.count("NVIDIA H100 80GB HBM3") == 4
    rows = {line.split("\t")[0]: [c.strip() for c in line.split("\t")[1:]] for line in topo[1:5]}
    assert rows["GPU0"][:4] == ["X", "NV18", "SYS", "SYS"]
    assert rows["GPU2"][:4] == ["SYS", "SYS", "X", "NV18"]
    assert rows["GPU0"][5] == "0" and rows["GPU2"][5] == "1"  # NUMA affinity: the sockets
    assert [line.split()[0] for line in lspci.splitlines() if "[10de:2330]" in line] == \
        ["18:00.0", "1e:00.0", "24:00.0", "2a:00.0"]
    assert "[10de:22a3]" not in lspci and "[15b3:" not in lspci  # no NVSwitch, no HCA


def test_mount_refuses_a_combination_with_its_reason(tmp_path):
    node = MountedNode(tmp_path, "l40s")
    res = node.cli("mount", str(node.mnt), "--profile", "l40s", "--node", "hgx-8", "--state-dir",
                   str(node.state_dir), check=False)
    assert res.returncode == 2
    assert "composition hgx-8 has 4 NVSwitches, but l40s (NVIDIA L40S) has no NVLink" in res.stderr
    bad = write(tmp_path, "wide", {**composition_data(), "gpus": 65, "slots": None})
    res = node.cli("mount", str(node.mnt), "--profile", "l40s", "--node", bad, "--state-dir",
                   str(node.state_dir), check=False)
    assert res.returncode == 2 and f"{bad}: invalid composition" in res.stderr and "gpus: Input should be" in res.stderr


def test_profile_nodes_lists_the_shipped_compositions():
    out = subprocess.run([*mokka_cmd(), "profile", "nodes"], capture_output=True, text=True, check=True).stdout
    assert [line.split()[0] for line in out.splitlines()] == SHIPPED_COMPOSITIONS
    assert "hgx-8           8 GPUs  2 x x86_64   4 NVSwitches   8 x ConnectX-7" in out


def test_agent_takes_the_composition_from_the_label_then_the_configmap():
    from mokkafs.agent.decisions import LABEL_NODE, node_composition

    labelled = {"metadata": {"labels": {LABEL_NODE: "pcie-8"}}}
    assert node_composition(labelled, "hgx-8") == "pcie-8"
    assert node_composition({"metadata": {}}, "hgx-8") == "hgx-8"
    assert node_composition({"metadata": {}}, "") is None  # MOKKA_NODE empty: the profile's own
    with pytest.raises(ValueError, match=r"bad node composition '../x' \(label mokkafs.io/node or MOKKA_NODE\)"):
        node_composition({"metadata": {"labels": {LABEL_NODE: "../x"}}}, None)


def test_a_state_directory_belongs_to_its_composition(tmp_path):
    """State saved by a node of the profile's own composition (or before compositions: the key
    has no `node` then) is not restored into another composition of the same count."""
    from mokkafs.daemon.persist import StateDir, StateError

    p = load_profile("h100")
    own = Node(compose(p, hostname="h"), digests.BORN)
    assert own.config.key == {"profile": "h100", "gpus": 8, "hostname": "h"}
    assert StateDir(tmp_path).open(own) is False
    assert StateDir(tmp_path).open(Node(compose(p, hostname="h"), digests.BORN)) is True
    other = Node(compose(p, node="pcie-8", hostname="h"), digests.BORN)
    with pytest.raises(StateError, match=r"'node': 'pcie-8'"):
        StateDir(tmp_path).open(other)


def test_agent_checks_injections_against_the_mounted_composition(tmp_path):
    """The agent's scratch node (what an annotation is validated on) has the HCAs of the
    composition it mounted, not of the profile's own."""
    from mokkafs.agent.watch import MountedTree

    (tmp_path / "node").mkdir()
    (tmp_path / "node" / "profile").write_text("l40s\n")
    (tmp_path / "node" / "gpu_count").write_text("8\n")
    assert MountedTree(str(tmp_path), "pcie-8").node_config().hcas == 4
    assert MountedTree(str(tmp_path)).node_config().hcas == 0
    with pytest.raises(ProfileError, match="unknown composition 'nope'"):
        MountedTree(str(tmp_path), "nope").node_config()


def test_a_profile_that_does_not_fit_its_own_composition_does_not_load(tmp_path):
    data = yaml.safe_load((ROOT / "profiles" / "l40s.yaml").read_text())
    data["composition"] = "hgx-8"
    with pytest.raises(ProfileError, match=r"l40s.yaml: invalid profile: \(top level\): Value error, composition "
                                           r"hgx-8 has 4 NVSwitches, but l40s \(NVIDIA L40S\) has no NVLink"):
        load_profile_file(Path(write(tmp_path, "l40s", data)))
    data = yaml.safe_load((NODE_SECTION_PROFILES / "t4.yaml").read_text())
    data["node"]["nvswitches"] = 2  # the node: format is held to the same rules
    with pytest.raises(ProfileError, match=r"composition t4-node has 2 NVSwitches, but t4"):
        load_profile_file(Path(write(tmp_path, "t4", data)))


def test_a_driver_given_alone_brings_its_branchs_cuda_version():
    """--driver-version without --cuda-version: the branch's CUDA version (docs/profiles.md,
    "Driver and CUDA"); with one, that one; neither, the composition's own pair."""
    h100 = load_profile("h100")
    assert compose(h100).cuda_version == "13.0"
    assert compose(h100, driver_version="550.163.01").cuda_version == "12.4"
    assert compose(h100, driver_version="565.57.01").cuda_version == "12.7"
    assert compose(h100, driver_version="585.1.2").cuda_version == "13.0"  # between listed branches
    assert compose(h100, driver_version="565.57.01", cuda_version="12.6").cuda_version == "12.6"


def test_every_shipped_driver_and_cuda_pair_is_the_branch_table():
    """The compositions and profiles pin a driver with its CUDA version: each pair is the one the
    model computes from the driver, so a node reports the same CUDA whichever way it is made."""
    from mokkafs.model.schema import cuda_of_driver

    pairs = [(c, load_composition(c)) for c in available_compositions()]
    pairs += [(p, load_profile(p).default_composition()) for p in available_profiles()]
    wrong = [(name, c.driver_version, c.cuda_version) for name, c in pairs
             if c.cuda_version != cuda_of_driver(c.driver_version)]
    assert not wrong
