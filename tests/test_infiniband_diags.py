"""Debian's real infiniband-diags (ibnetdiscover, iblinkinfo, perfquery, sminfo, ibaddr, ibroute,
smpquery), unmodified, under `mokka run`: their libibmad loads our libibumad.so.3 from the
driver root, whose MADs are answered from the node's fabric (docs/infiniband.md). Two
compositions: the H100 node's default fabric, and an A100 node whose composition declares a
two-node rail group with one spine and the SM on a leaf. Port faults written to
`ib/mlx5_N/port1` show in the next read; an attribute we do not model gets the real status."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from conftest import MountedNode, force_unmount, mokka_cmd

from mokkafs.model.profiles import load_composition

pytestmark = pytest.mark.level("tools")

TOOLS = ("ibnetdiscover", "iblinkinfo", "perfquery", "sminfo", "ibaddr", "ibroute", "smpquery")


def _mount(tmp: Path, profile: str, extra: tuple[str, ...]) -> MountedNode:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    assert not missing, f"real tools missing (apt install infiniband-diags): {missing}"
    n = MountedNode(tmp, profile)
    n.expected_warnings.append(re.compile("EINVAL"))
    n.mount(extra)
    return n


def _finish(n: MountedNode, tmp: Path) -> None:
    n.umount()
    force_unmount(n.mnt)
    problems = n.unexpected_log_lines()
    shutil.rmtree(tmp, ignore_errors=True)
    assert problems == []


@pytest.fixture(scope="module")
def h100():
    tmp = Path(tempfile.mkdtemp(prefix="mokka-ib-"))
    tmp.chmod(0o755)
    n = _mount(tmp, "h100", ("--hostname", "gpu-a"))
    yield n
    _finish(n, tmp)


@pytest.fixture(scope="module")
def a100_pair():
    """hgx-a100-8 (HDR) with a declared fabric: two nodes, one spine, the SM on leaf-2."""
    tmp = Path(tempfile.mkdtemp(prefix="mokka-ib-"))
    tmp.chmod(0o755)
    comp = load_composition("hgx-a100-8").model_dump(mode="json", exclude_none=True)
    comp["fabric"] = {"name": "railgroup", "nodes": ["gpu-a", "gpu-b"], "spines": 1, "sm": "leaf-2"}
    path = tmp / "pair.yaml"
    path.write_text(yaml.safe_dump(comp))
    n = _mount(tmp, "a100", ("--node", str(path), "--hostname", "gpu-b"))
    yield n
    _finish(n, tmp)


def run(node: MountedNode, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*mokka_cmd(), "run", "--root", str(node.mnt), "--", *cmd],
                          capture_output=True, text=True, env=node.env, timeout=timeout)


def ok(node: MountedNode, *cmd: str) -> str:
    r = run(node, *cmd)
    assert r.returncode == 0, (cmd, r.stdout, r.stderr)
    return r.stdout


def test_ibnetdiscover_prints_the_default_fabric(h100):
    out = ok(h100, "ibnetdiscover")
    switches = re.findall(r'^Switch\t64 "S-(fc6a1c03[0-9a-f]{8})"\t\t# "MF0;fabric-(\S+):MQM9700/U1" enhanced port 0 lid (\d+) lmc 0$',
                          out, re.M)
    assert sorted(s[1] for s in switches) == sorted([f"leaf-{j}" for j in range(1, 9)] + ["spine-1", "spine-2"])
    cas = re.findall(r'^Ca\t1 "H-(a088c203[0-9a-f]{8})"\t\t# "gpu-a (mlx5_\d)"$', out, re.M)
    assert sorted(c[1] for c in cas) == [f"mlx5_{j}" for j in range(8)]
    # every CA on its rail's leaf port 1, at its sysfs LID, 4X NDR; each leaf cabled to both spines
    for j in range(8):
        guid = h100.read(f"sys/class/infiniband/mlx5_{j}/node_guid").strip().replace(":", "")
        assert re.search(rf'^\[1\]\t"H-{guid}"\[1\]\({guid}\) \t\t# "gpu-a mlx5_{j}" lid {0x12 + j} 4xNDR$', out, re.M), out
    assert len(re.findall(r'^\[3[34]\]\t"S-\w+"\[\d\]\t\t# "MF0;fabric-spine-[12]:MQM9700/U1" lid [12] 4xNDR$', out, re.M)) == 16


def test_iblinkinfo_perfquery_and_ibstat_follow_a_port_fault(h100):
    def leaf2_port1() -> str:
        out = ok(h100, "iblinkinfo")
        return next(line for line in out.splitlines() if re.match(r"\s+4\s+1\[", line))

    assert "4X        106.25 Gbps Active/  LinkUp)==>" in leaf2_port1()
    assert re.search(r"^SymbolErrorCounter:\.+0$", ok(h100, "perfquery", "19", "1"), re.M)
    try:
        assert h100.write("ib/mlx5_1/port1", b"errors 7\n") == 0
        assert re.search(r"^SymbolErrorCounter:\.+7$", ok(h100, "perfquery", "19", "1"), re.M)
        assert h100.write("ib/mlx5_1/port1", b"down\n") == 0
        assert "Down/ Polling)==>" in leaf2_port1()
        assert "State: Down" in ok(h100, "ibstat", "mlx5_1")
        # the HCA's LID is gone from the fabric: a LID-routed query times out (no hang)
        r = run(h100, "smpquery", "nodeinfo", "19")
        assert r.returncode != 0 and "_do_madrpc failed" in r.stderr
        # its counters are still read on the HCA itself
        assert re.search(r"^SymbolErrorCounter:\.+7$", ok(h100, "perfquery", "-C", "mlx5_1"), re.M)
        assert "0x0013 255" not in ok(h100, "ibroute", "4")  # leaf-2 no longer routes LID 19
    finally:
        h100.write("ib/mlx5_1/port1", b"up\n")
        h100.write("node/reset", b"1\n")
    assert "Active/  LinkUp)==>" in leaf2_port1()
    assert re.search(r"^0x0013 001 : \(Channel Adapter portguid 0x\w+: 'gpu-a mlx5_1'\)$", ok(h100, "ibroute", "4"), re.M)


def test_sminfo_ibaddr_smpquery_ibroute(h100):
    sm_guid = re.search(r"switchguid=0x(\w+)\(\w+\)\nSwitch.*fabric-spine-1", ok(h100, "ibnetdiscover")).group(1)
    assert re.match(rf"sminfo: sm lid 1 sm guid 0x{sm_guid}, activity count \d+ priority 14 state 3 SMINFO_MASTER$",
                    ok(h100, "sminfo").strip())
    guid0 = h100.read("sys/class/infiniband/mlx5_0/node_guid").strip().replace(":", "")
    assert ok(h100, "ibaddr").strip() == f"GID fe80::{guid0[0:4]}:{guid0[4:8].lstrip('0') or '0'}:" \
        f"{guid0[8:12].lstrip('0') or '0'}:{guid0[12:16].lstrip('0') or '0'} LID start 0x12 end 0x12"
    info = ok(h100, "smpquery", "nodeinfo", "1")
    assert re.search(r"^NodeType:\.+Switch$", info, re.M) and re.search(r"^DevId:\.+0xd2f0$", info, re.M)
    assert ok(h100, "smpquery", "-D", "nodedesc", "0,1,33").strip() == "Node Description:...MF0;fabric-spine-1:MQM9700/U1"
    port = ok(h100, "smpquery", "portinfo", "20")
    assert re.search(r"^Lid:\.+20$", port, re.M) and re.search(r"^LinkState:\.+Active$", port, re.M)
    routes = ok(h100, "ibroute", "3")
    assert "Unicast lids [0x0-0x19] of switch Lid 3" in routes
    assert re.search(r"^0x0012 001 : \(Channel Adapter portguid 0x\w+: 'gpu-a mlx5_0'\)$", routes, re.M)
    assert re.search(r"^0x0013 03[34] : ", routes, re.M)  # another rail: up to a spine


@pytest.mark.parametrize("cmd", [
    ("smpquery", "sl2vl", "1"),            # SL2VLTable: not modelled
    ("smpquery", "vlarb", "18"),           # VLArbitrationTable
    ("smpquery", "switchinfo", "18"),      # SwitchInfo of a CA
    ("perfquery", "-E", "18", "1"),        # PortRcvErrorDetails
    ("sminfo", "3"),                       # SMInfo of a switch without the SM
])
def test_unmodelled_attributes_get_the_real_status_at_once(h100, cmd):
    t0 = time.monotonic()
    r = run(h100, cmd[0], "-d", *cmd[1:], timeout=30)
    assert r.returncode != 0
    assert "MAD completed with error status 0xc" in r.stderr, r.stderr  # unsupported method/attribute
    assert time.monotonic() - t0 < 10


def test_a_declared_rail_group_shows_both_nodes(a100_pair):
    out = ok(a100_pair, "ibnetdiscover")
    hcas = int(re.search(r"hcas: (\d+)", yaml.safe_dump(load_composition("hgx-a100-8").model_dump())).group(1))
    for host in ("gpu-a", "gpu-b"):
        assert len(re.findall(rf'^Ca\t1 "H-\w+"\t\t# "{host} mlx5_\d"$', out, re.M)) == hcas
    assert len(re.findall(r'^Switch\t40 "S-\w+"\t\t# "MF0;railgroup-(?:leaf|spine)-\d+:MQM8700/U1"', out, re.M)) == hcas + 1
    assert "4xHDR" in out and "4xNDR" not in out
    # gpu-b is the second node: its LIDs follow gpu-a's; the SM runs on leaf-2 (LID 1)
    assert a100_pair.read("sys/class/infiniband/mlx5_0/ports/1/lid").strip() == f"0x{0x12 + hcas:x}"
    assert re.search(r"sm lid 1 sm guid 0x\w+, activity count \d+ priority 14 state 3 SMINFO_MASTER", ok(a100_pair, "sminfo"))
    assert re.fullmatch(r"Node Description:\.+MF0;railgroup-leaf-2:MQM8700/U1",
                        ok(a100_pair, "smpquery", "nodedesc", "1").strip())
    links = ok(a100_pair, "iblinkinfo")
    assert len(re.findall(r"==\( 4X\s+53\.125 Gbps Active/  LinkUp\)==>", links)) >= 2 * hcas
    try:
        assert a100_pair.write("ib/mlx5_0/port1", b"down\n") == 0
        after = ok(a100_pair, "ibnetdiscover")
        assert len(re.findall(r'^Ca\t1 "H-\w+"\t\t# "gpu-b mlx5_\d"$', after, re.M)) == hcas - 1
        assert len(re.findall(r'^Ca\t1 "H-\w+"\t\t# "gpu-a mlx5_\d"$', after, re.M)) == hcas
    finally:
        a100_pair.write("ib/mlx5_0/port1", b"up\n")
