"""Real MIG creation sequences (tests/fixtures/mig_sequences.yaml): each one replayed through the
model and through our `nvidia-smi mig -cgi/-cci/-lgi/-lci` on a mounted node, ids and placements
compared exactly with what the real driver printed (docs/mig.md, "Where an instance goes")."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from conftest import world_readable_node
from mokkafs.model import Node, compose, mig
from mokkafs.model.commands import parse_line
from mokkafs.model.profiles import load_profile
from test_smi_mig import ok

pytestmark = pytest.mark.level("model")

T0 = 1_800_000_000.0
FIXTURE = yaml.safe_load((Path(__file__).parent / "fixtures" / "mig_sequences.yaml").read_text())
SEQUENCES = FIXTURE["sequences"]
GPU = {"plain": 0, "swapped": 7}  # the boards' `swapped_halves` is [7]


def test_the_fixture_holds_enough_real_sequences_of_both_kinds():
    assert len(SEQUENCES) >= 5 and all(s["source"] for s in SEQUENCES)
    assert {s["kind"] for s in SEQUENCES} == {"plain", "swapped"}
    assert {s["board"] for s in SEQUENCES} == {"h100", "a100"}
    for board in ("h100", "a100"):
        assert load_profile(board).mig.swapped_halves == (GPU["swapped"],)


def _line(node: Node, gpu: int, step: dict) -> str:
    """The vocabulary's line for one step: `-cgi LIST [-C]`, or `-gi GI -cci`, whose default is
    the GPU instance's full-size compute instance (named by its GPU instance's profile name)."""
    if "cgi" in step:
        return f"gpu={gpu} mig {'create' if step['C'] else 'create_gi'} {','.join(map(str, step['cgi']))}"
    gi = node.gpus[gpu].mig.gi(step["cci"])
    return f"gpu={gpu} mig create_ci {gi.id} {mig.gi_profile_by_index(node.profile.mig, gi.profile).name}"


def _model_placements(node: Node, gpu: int) -> tuple[dict[int, str], dict[str, str]]:
    lgi, lci = {}, {}
    for g in node.gpus[gpu].mig.instances:
        lgi[g.id] = f"{g.start}:{g.size}"
        for c in g.compute:
            lci[f"{g.id}/{c.id}"] = f"{c.start}:{c.size}"
    return lgi, lci


@pytest.mark.parametrize("seq", SEQUENCES, ids=[s["name"] for s in SEQUENCES])
def test_the_model_gives_the_real_driver_s_ids_and_placements(seq):
    gpu = GPU[seq["kind"]]
    node = Node(compose(load_profile(seq["board"]), gpus=8), T0)
    node.apply(parse_line(f"gpu={gpu} mig enable").event, T0)
    for step in seq["steps"]:
        event = parse_line(_line(node, gpu, step)).event
        node.validate(event)
        reply = node.apply(event, T0).reply
        made = [int(m) for m in re.findall(r"gi=(\d+)" if "cgi" in step else r"ci=(\d+)", reply)]
        assert made == step["ids"], (seq["name"], step)
    lgi, lci = _model_placements(node, gpu)
    assert {k: v for k, v in lgi.items() if k in seq.get("lgi", {})} == seq.get("lgi", {})
    assert {k: v for k, v in lci.items() if k in seq.get("lci", {})} == seq.get("lci", {})
    assert set(seq.get("lgi", {})) <= set(lgi) and set(seq.get("lci", {})) <= set(lci)


@pytest.fixture(scope="module", params=["h100", "a100"])
def mounted(request):
    yield from world_readable_node(request.param, gpus=8)


LGI_ROW = re.compile(r"^\|\s+(\d+)\s+MIG \S+\s+\d+\s+(\d+)\s+(\d+:\d+)\s+\|$")
LCI_ROW = re.compile(r"^\|\s+(\d+)\s+(\d+)\s+MIG \S+\s+\d+\s+(\d+)\s+(\d+:\d+)\s+\|$")


@pytest.mark.level("shims")
def test_our_nvidia_smi_gives_the_real_driver_s_ids_and_placements(mounted):
    node = mounted
    node.expect_warning(r"ctl\.sock: in_use from uid 0")
    for seq in (s for s in SEQUENCES if s["board"] == node.profile):
        gpu = str(GPU[seq["kind"]])
        ok(node, "-i", gpu, "-mig", "1")
        for step in seq["steps"]:
            if "cgi" in step:
                cgi = ",".join(map(str, step["cgi"]))
                out = ok(node, "mig", "-i", gpu, "-cgi", cgi, *(["-C"] if step["C"] else []))
                made = [int(m) for m in re.findall(r"created GPU instance ID +(\d+) on GPU", out)]
            else:
                out = ok(node, "mig", "-i", gpu, "-gi", str(step["cci"]), "-cci")
                made = [int(m) for m in re.findall(r"created compute instance ID +(\d+) on GPU", out)]
            assert made == step["ids"], (seq["name"], step, out)
        lgi = {int(m[2]): m[3] for m in map(LGI_ROW.match, ok(node, "mig", "-i", gpu, "-lgi").splitlines()) if m}
        # -lci with no compute instances exits 6 ("No compute instances found"), as the real one does
        listed = ok(node, "mig", "-i", gpu, "-lci") if "lci" in seq else ""
        lci = {f"{m[2]}/{m[3]}": m[4] for m in map(LCI_ROW.match, listed.splitlines()) if m}
        assert {k: lgi.get(k) for k in seq.get("lgi", {})} == seq.get("lgi", {}), seq["name"]
        assert {k: lci.get(k) for k in seq.get("lci", {})} == seq.get("lci", {}), seq["name"]
        assert len(lgi) == sum(len(s["ids"]) for s in seq["steps"] if "cgi" in s)
        assert node.cli("inject", "--root", str(node.mnt), gpu, "mig", "clear").returncode == 0
