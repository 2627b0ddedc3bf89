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
    switches = re.findall(r'^Switch\t65 "S-(b0cf0e03[0-9a-f]{8})"\t\t# "MF0;fabric-(\S+):MQM9700/U1" enhanced port 0 lid (\d+) lmc 0$',
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
    assert re.search(r"^NodeType:\.+Switch$", info, re.M) and re.search(r"^DevId:\.+0xd2f2$", info, re.M)
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
    assert len(re.findall(r'^Switch\t41 "S-\w+"\t\t# "MF0;railgroup-(?:leaf|spine)-\d+:MQM8700/U1"', out, re.M)) == hcas + 1
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


HARNESS = r"""
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*open_t)(const char *, int);
typedef int (*close_t)(int);
typedef int (*reg_t)(int, int, int, uint8_t, long *);
typedef int (*send_t)(int, int, void *, int, int, int);
typedef int (*recv_t)(int, void *, int *, int);
typedef int (*getca_t)(const char *, void *);
typedef int (*guids_t)(const char *, uint64_t *, int);
typedef int (*unreg_t)(int, int);
typedef int (*getport_t)(const char *, int, void *);

static uint64_t s = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; }
#define SYM(t, n) t n = (t)dlsym(h, #n); if (!n) { printf("missing %s\n", #n); return 2; }

int main(int argc, char **argv) {
    int rounds = atoi(argv[1]);
    void *h = dlopen("libibumad.so.3", RTLD_NOW);
    if (!h) { printf("dlopen: %s\n", dlerror()); return 2; }
    SYM(open_t, umad_open_port) SYM(close_t, umad_close_port) SYM(reg_t, umad_register)
    SYM(send_t, umad_send) SYM(recv_t, umad_recv) SYM(getca_t, umad_get_ca) SYM(guids_t, umad_get_ca_portguids)
    SYM(unreg_t, umad_unregister) SYM(getport_t, umad_get_port)
    uint8_t buf[64 + 4096];
    int len = 256;
    /* bad arguments: errors, never a crash */
    if (umad_open_port("nope", 0) >= 0 || umad_open_port("../../x", 1) >= 0 || umad_open_port(NULL, 99) >= 0) return 3;
    if (umad_close_port(-1) >= 0 || umad_send(-5, 0, buf, 256, 10, 0) >= 0 || umad_recv(-5, buf, &len, 0) >= 0) return 3;
    if (umad_get_ca(NULL, NULL) >= 0 || umad_get_port("nope", 1, buf) >= 0 || umad_get_ca_portguids(NULL, NULL, 0) >= 0) return 3;
    int port = umad_open_port(NULL, 0);
    if (port < 0) { printf("open %d\n", port); return 4; }
    if (umad_register(port, 300, 1, 0, NULL) >= 0 || umad_unregister(port, 31) >= 0) return 3;
    if (umad_send(port, 7, buf, 256, 10, 0) >= 0 || umad_recv(port, NULL, &len, 0) >= 0) return 3;
    int agents[5];
    static const int classes[5] = {0x81, 0x01, 0x04, 0x03, 0x0a};
    for (int i = 0; i < 5; i++)
        agents[i] = umad_register(port, classes[i], classes[i] == 3 ? 2 : 1, 0, NULL);
    static const uint16_t attrs[] = {0x10, 0x11, 0x12, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x20,
                                     0x01, 0x1d, 0x13, 0x35, 0xff90, 0xffff, 0x0000};
    int replies = 0, lost = 0, statuses = 0;
    for (int n = 0; n < rounds; n++) {
        memset(buf, 0, sizeof buf);
        uint8_t *m = buf + 64;
        for (int k = 0; k < 256; k++) m[k] = (uint8_t)rnd();
        int a = (int)(rnd() % 5);
        if (rnd() % 8) { m[0] = 1; m[1] = (uint8_t)classes[a]; m[2] = classes[a] == 3 ? 2 : 1; }
        if (rnd() % 4) m[3] = (uint8_t)(1 + rnd() % 2);
        if (rnd() % 4) { uint16_t at = attrs[rnd() % (sizeof attrs / sizeof attrs[0])]; m[16] = at >> 8; m[17] = at & 0xff; }
        if (rnd() % 2) m[7] = (uint8_t)(rnd() % 4);
        if (rnd() % 2) { m[129] = 1; m[130] = (uint8_t)(rnd() % 40); }
        uint16_t dlid = (rnd() % 3) ? (uint16_t)(rnd() % 32) : (uint16_t)rnd();
        buf[28] = dlid >> 8; buf[29] = dlid & 0xff;  /* addr.lid, network order */
        uint64_t tid = rnd();
        memcpy(m + 8, &tid, 8);
        int slen = (rnd() % 8) ? 256 : (int)(24 + rnd() % 300);
        if (slen > 256 && rnd() % 2) slen = 256;
        if (umad_send(port, agents[a], buf, slen, 3, 0) < 0) { printf("send failed\n"); return 5; }
        uint8_t in[64 + 8192];
        int rl = 16;
        if (m[3] & 0x80) {  /* a response: nothing comes back */
            rl = 8192;
            if (umad_recv(port, in, &rl, 20) >= 0) { printf("a response was answered\n"); return 9; }
            continue;
        }
        int r = umad_recv(port, in, &rl, 2000);
        if (r == -ENOSPC) { rl = 8192; r = umad_recv(port, in, &rl, 2000); }
        if (r < 0) { printf("recv %d at round %d\n", r, n); return 6; }
        uint32_t status; memcpy(&status, in + 4, 4);
        if (memcmp(in + 64 + 8, &tid, 8)) { printf("tid mismatch at %d\n", n); return 7; }
        if (status == ETIMEDOUT) lost++;
        else if (status == 0) { replies++; if ((in[64 + 4] << 8 | in[64 + 5]) & 0x7fff) statuses++; }
        else { printf("status %u\n", status); return 8; }
    }
    umad_close_port(port);
    printf("ok replies %d lost %d error-statuses %d\n", replies, lost, statuses);
    return 0;
}
"""


def test_random_mads_and_bad_arguments_never_crash_or_hang(h100, tmp_path):
    """Thousands of random MADs (classes, attributes, methods, hop counts, routes, lengths) and
    bad arguments: every call returns, every sent MAD comes back (a reply or ETIMEDOUT, with its
    transaction id), and nothing crashes."""
    src = tmp_path / "harness.c"
    src.write_text(HARNESS)
    exe = tmp_path / "harness"
    subprocess.run(["cc", "-O1", "-o", str(exe), str(src), "-ldl"], check=True)
    exe.chmod(0o755)
    tmp_path.chmod(0o755)
    t0 = time.monotonic()
    r = run(h100, str(exe), "3000", timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    m = re.search(r"ok replies (\d+) lost (\d+) error-statuses (\d+)", r.stdout)
    assert m and int(m.group(1)) > 500 and int(m.group(2)) > 50 and int(m.group(3)) > 100, r.stdout
    assert time.monotonic() - t0 < 100


def test_sa_queries_answer_from_the_sm(h100):
    """saquery's NodeRecord and PathRecord tables (GetTable, handed over as the kernel reassembles
    RMPP) and the PathRecord Get that ibaddr -G / smpquery -G resolve a GUID with."""
    nodes = ok(h100, "saquery", "NR")
    assert nodes.count("NodeRecord dump:") == 18  # 10 switches, 8 HCAs
    assert re.search(r"NodeDescription\.+gpu-a mlx5_7$", nodes, re.M)
    path = ok(h100, "saquery", "--src-to-dst", "18:21")
    assert path.count("PathRecord dump:") == 1
    assert re.search(r"^\s+dlid\.+21$", path, re.M) and re.search(r"^\s+slid\.+18$", path, re.M)
    assert re.search(r"^\s+mtu\.+0x85$", path, re.M)  # 4096
    assert ok(h100, "saquery", "PR").count("PathRecord dump:") == 18
    guid = h100.read("sys/class/infiniband/mlx5_3/node_guid").strip().replace(":", "")
    assert "LID start 0x15 end 0x15" in ok(h100, "ibaddr", "-G", f"0x{guid}")
    assert ok(h100, "smpquery", "-G", "nodedesc", f"0x{guid}").strip().endswith("gpu-a mlx5_3")
    r = run(h100, "saquery", "SR")  # ServiceRecord: not modelled
    assert r.returncode != 0 and "0x000c" in r.stdout + r.stderr
