"""No N/A where a real board has a value and the model has it: our nvidia-smi's `-q` against
the real 590 (H100) and 595 (L40S) text captures, and its `-q -x` against each board's XML
capture, on the same board at the capture's driver. A line or element where the capture has a
value and ours prints N/A fails, unless the allow-list below says why the model cannot have it."""
from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET

import pytest

from helpers_nvml import Published, consumer_env, nvml_path
from helpers_smi import CAPTURES, TEXT_H100, TEXT_L40S, XML_PROFILES, capture_section, smi_binary

pytestmark = pytest.mark.level("shims")

NA = ("N/A", "[N/A]", "")

# -q label path (headers joined by "/") or -q -x element path -> why the model has no value.
# Each reason names what a simulated node lacks; nothing the model computes may be here.
CANNOT = {
    "Display Attached": "a monitor on the connector: the captures' headless boards say Yes, which NVML's "
                        "display getters do not explain; the model has no display",
    "display_attached": "as Display Attached",
    "PCI/Atomic Caps Outbound": "the host's PCIe AtomicOp routing; the model's PCIe tree has no atomics",
    "pci/atomic_caps_outbound": "as PCI/Atomic Caps Outbound",
    "GPU Memory Power Readings /Average Power Draw": "the memory's own power: the model has the GPU's power only",
    "gpu_memory_power_readings/average_power_draw": "as GPU Memory Power Readings",
    "pci/atomic_caps_inbound": "as PCI/Atomic Caps Outbound",
    **{f"module_power_readings/{x}": "the module's (Grace tray's) power and limits: the model has the GPU's only"
       for x in ("average_power_draw", "instant_power_draw", "current_power_limit", "requested_power_limit",
                 "default_power_limit", "min_power_limit", "max_power_limit")},
    **{f"platformInfo/{x}": "where the tray sits in its NVL72 rack (chassis, slot, tray, host, peer, fabric GUID): "
                            "the model places a node's GPUs by module id only"
       for x in ("chassis_serial_number", "slot_number", "tray_index", "host_id", "peer_type", "gpu_fabric_guid")},
    "power_smoothing": "not a value: the capture's user lacked the permission ('Insufficient Permissions')",
    **{f"inforom_bbx_flush/{x}": "when the InfoROM black box last flushed: the model keeps no InfoROM log"
       for x in ("latest_timestamp", "latest_duration")},
    "pci/pci_gpu_link_info/pcie_gen/max_host_link_gen": "the host CPU's own PCIe generation (GB300's Grace: 4): "
                                                        "the model has the link's, not the host's",
}


@pytest.fixture(scope="module")
def smi(tmp_path_factory):
    nvml_path()
    return smi_binary(tmp_path_factory)


def ours(smi, tmp_path, profile: str, driver: str, *args: str) -> str:
    pub = Published(tmp_path, profile, gpus=1, driver_version=driver)
    try:
        r = subprocess.run([str(smi), *args], env=consumer_env(pub.path), capture_output=True, text=True, timeout=30)
    finally:
        pub.close()
    assert r.returncode == 0, r.stderr
    return r.stdout


def text_values(lines: list[str]) -> dict[str, str]:
    """label path -> value of the first GPU's -q lines (headers joined by '/'), first occurrence."""
    start = next(i for i, l in enumerate(lines) if l.startswith("GPU 0000")) + 1
    out: dict[str, str] = {}
    stack: list[str] = []
    for line in lines[start:]:
        if not line.strip():
            break
        depth = (len(line) - len(line.lstrip(" "))) // 4 - 1
        del stack[depth:]
        if len(line) > 55 and line[55] == ":":
            label = line[:55].strip()
            out.setdefault("/".join(stack + [label]), line[57:].strip())
            stack.append(label)
        else:
            stack.append(line.lstrip(" "))
    return out


def missing(real: dict[str, str], mine: dict[str, str]) -> list[str]:
    return [f"{path}: real {v!r}, ours {mine[path]!r}" for path, v in real.items()
            if path in mine and v not in NA and mine[path] in NA and path not in CANNOT]


@pytest.mark.parametrize("profile, capture, driver", [("h100", TEXT_H100, "590.48.01"), ("l40s", TEXT_L40S, "595.80")],
                         ids=["h100-590", "l40s-595"])
def test_query_text_has_no_na_where_the_capture_and_the_model_have_a_value(smi, tmp_path, profile, capture, driver):
    real = text_values(capture_section(capture, "idle :: query (-q)"))
    mine = text_values(ours(smi, tmp_path, profile, driver, "-q").splitlines())
    assert len(set(real) & set(mine)) > 190
    gaps = missing(real, mine)
    assert not gaps, f"{len(gaps)} N/A lines where the {driver} capture has a value:\n  " + "\n  ".join(gaps)


def xml_values(text: str) -> dict[str, str]:
    """element path -> text of the first GPU's leaves (first occurrence; list entries collapse)."""
    gpu = ET.fromstring(text).find("gpu")
    out: dict[str, str] = {}

    def walk(e, prefix):
        for c in e:
            p = f"{prefix}{c.tag}"
            if len(c):
                walk(c, p + "/")
            else:
                out.setdefault(p, (c.text or "").strip())

    walk(gpu, "")
    return out


@pytest.mark.parametrize("profile", XML_PROFILES)
def test_query_xml_has_no_na_where_the_capture_and_the_model_have_a_value(smi, tmp_path, profile):
    path = CAPTURES / f"nvidia-smi-q-x.{profile}.xml"
    driver = ET.parse(path).getroot().findtext("driver_version")
    real = xml_values(path.read_text())
    mine = xml_values(ours(smi, tmp_path, profile, driver, "-q", "-x"))
    assert len(set(real) & set(mine)) > 150
    gaps = missing(real, mine)
    assert not gaps, f"{len(gaps)} N/A elements where the {profile} capture has a value:\n  " + "\n  ".join(gaps)


def test_the_allow_list_names_only_paths_the_captures_have(smi):
    """A stale entry would hide nothing and mislead: each must name a line or element of a capture."""
    paths = set(text_values(capture_section(TEXT_H100, "idle :: query (-q)")))
    paths |= set(text_values(capture_section(TEXT_L40S, "idle :: query (-q)")))
    for p in XML_PROFILES:
        paths |= set(xml_values((CAPTURES / f"nvidia-smi-q-x.{p}.xml").read_text()))
    assert not [k for k in CANNOT if k not in paths]
