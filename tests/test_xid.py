"""The Xid catalogue (model/xid.py) against the model, nvml.h and docs/faults.md, and the
typed counter keys (model/counters.py) against nvml.h."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mokkafs.model import Node, compose
from mokkafs.model.counters import EccCounter, EccKind, EccScope, MemoryLocation, NvLinkCounter
from mokkafs.model.events import InjectXid
from mokkafs.model.outcome import EVENT_DBE, EVENT_SBE, EVENT_XID
from mokkafs.model.xid import XIDS, Remap, kernel_log_line, xid_rule
from mokkafs.model.profiles import load_profile

pytestmark = pytest.mark.level("model")

REPO = Path(__file__).resolve().parents[1]
T0 = 1_800_000_000.0


def _nvml_event_bits() -> dict[str, int]:
    header = (REPO / "shims" / "include" / "nvml.h").read_text()
    return {m[1]: int(m[2], 16) for m in re.finditer(r"#define (nvmlEventType\w+)\s+0x([0-9A-Fa-f]+)LL", header)}


@pytest.mark.parametrize("profile", ["h100", "t4"])
@pytest.mark.parametrize("code", [*XIDS, 1, 999])
def test_each_xid_does_what_its_catalogue_row_says(profile, code):
    node = Node(compose(load_profile(profile), gpus=2, hostname="xid"), T0)
    rule = xid_rule(code)
    notes = node.apply(InjectXid(1, code), T0).notifications
    g = node.gpus[1]
    bits = _nvml_event_bits()
    assert [n.event_type for n in notes] == [bits[name] for name in rule.nvml_events]
    assert notes[0].data == code
    assert node.health(1) == rule.health
    assert (g.lost, g.needs_reset) == (rule.lost, rule.needs_reset)
    assert g.recovery_action == rule.recovery.spelling
    counted = {c: n for c, n in g.ecc.items() if n}
    if rule.ecc is None:
        assert counted == {}
    else:
        assert counted == {EccCounter(s, rule.ecc.kind, rule.ecc.location): rule.ecc.count for s in EccScope}
        assert notes[1].data == rule.ecc.count
    remapper = profile != "t4"  # Turing retires pages instead
    assert g.remap_pending == (remapper and rule.remap is Remap.PENDING)
    assert g.remap_failure == (remapper and rule.remap is Remap.FAILED)
    assert g.retired_pending == (not remapper and rule.remap is not None)
    errs = {link: {c: n for c, n in e.items() if n} for link, e in g.nvlink_errors.items()}
    assert errs == ({0: dict.fromkeys(rule.nvlink_errors, 1)} if rule.nvlink_errors else {})
    assert node.log[-1].text == kernel_log_line(node.identities[1].bdf.xid, code, remapper=remapper, link=0)
    if code in (63, 64):  # a row remapped, or a page retired, in the driver's words for each
        assert ("Row Remapper" in node.log[-1].text) == remapper
        assert ("Dynamic Page Retirement" in node.log[-1].text) == (not remapper)
    assert g.xid_counts == {str(code): 1} and g.last_xid == code
    assert {EVENT_XID, EVENT_SBE, EVENT_DBE} <= set(bits.values())


def test_docs_faults_md_is_generated_from_the_catalogue():
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_faults_doc.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    spec = importlib.util.spec_from_file_location("gen_faults_doc", REPO / "scripts" / "gen_faults_doc.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    doc = (REPO / "docs" / "faults.md").read_text()
    stale = doc.replace("| 79 | the GPU is lost", "| 79 | nothing")
    assert stale != doc and gen.render(stale) == doc, "the check sees a row that disagrees"


def test_counter_keys_are_nvml_indices():
    """The typed keys' values are where nvml.h (and so the shared state) puts each count."""
    header = (REPO / "shims" / "include" / "nvml.h").read_text()
    enum = {m[1]: int(m[2]) for m in re.finditer(r"\b(NVML_\w+)\s*=\s*(\d+)\s*,", header)}
    assert {c.name: int(c) for c in EccScope} == {"VOLATILE": enum["NVML_VOLATILE_ECC"],
                                                  "AGGREGATE": enum["NVML_AGGREGATE_ECC"]}
    assert [int(k) for k in EccKind] == [enum["NVML_MEMORY_ERROR_TYPE_CORRECTED"],
                                         enum["NVML_MEMORY_ERROR_TYPE_UNCORRECTED"]]
    nvml_locations = ["L1_CACHE", "L2_CACHE", "DRAM", "REGISTER_FILE", "TEXTURE_MEMORY", "TEXTURE_SHM", "CBU", "SRAM"]
    assert [int(loc) for loc in MemoryLocation] == [enum[f"NVML_MEMORY_LOCATION_{n}"] for n in nvml_locations]
    assert {c.name: int(c) for c in NvLinkCounter} == {
        n: enum[f"NVML_NVLINK_ERROR_DL_{n}"] for n in ("REPLAY", "RECOVERY", "CRC_FLIT", "CRC_DATA")
    }
    assert [loc.spelling for loc in MemoryLocation] == ["l1", "l2", "dram", "register", "texture", "texture_shm",
                                                        "cbu", "sram"]
    for bad in ("DRAM", "Dram", "dram ", "device_memory", ""):
        with pytest.raises(ValueError):
            MemoryLocation.from_spelling(bad)
