"""Shipped GPU profiles: they load, they match the real captures, and broken ones fail clearly.

Ground truth is the real `nvidia-smi -q -x` output of each board. The seven captures are kept as
fixtures in tests/fixtures/captures/ (Apache-2.0, NVIDIA/k8s-test-infra) so these tests never
skip in CI; MOKKA_CAPTURES can point at another copy.
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mokkafs.model.schema import GpuProfile, ProfileError
from mokkafs.model.profiles import available_profiles, load_profile, load_profile_file

pytestmark = pytest.mark.level("model")

SHIPPED = ["a100", "a100-80gb", "a10g", "b200", "gb200", "gb300", "h100", "h100-nvl", "h200", "l4", "l40s", "t4"]
WITH_CAPTURE = ["a100", "b200", "gb200", "gb300", "h100", "l40s", "t4"]

FIXTURE_CAPTURES = Path(__file__).parent / "fixtures" / "captures"


def _capture_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("MOKKA_CAPTURES"):
        dirs.append(Path(os.environ["MOKKA_CAPTURES"]))
    dirs.append(FIXTURE_CAPTURES)
    return dirs


def _capture_path(name: str) -> Path:
    filename = f"nvidia-smi-q-x.{name}.xml"
    for d in _capture_dirs():
        if (d / filename).is_file():
            return d / filename
    pytest.skip(f"capture {filename} not found in {', '.join(str(d) for d in _capture_dirs())}")


def _text(gpu: ET.Element, path: str) -> str:
    node = gpu.find(path)
    assert node is not None, f"capture has no <{path}>"
    return (node.text or "").strip()


def _num(gpu: ET.Element, path: str) -> float:
    """'400.00 W' -> 400.0, '81559 MiB' -> 81559.0, '16x' -> 16.0."""
    return float(_text(gpu, path).split()[0].rstrip("x"))


def _hex_pair(value: str) -> tuple[int, int]:
    """nvidia-smi's 'DDDDVVVV' (device<<16 | vendor) -> (device, vendor)."""
    raw = int(value, 16)
    return raw >> 16, raw & 0xFFFF


@pytest.fixture(scope="module", params=WITH_CAPTURE)
def pair(request) -> tuple[GpuProfile, ET.Element, list[ET.Element]]:
    root = ET.parse(_capture_path(request.param)).getroot()
    gpus = root.findall("gpu")
    assert gpus, "capture has no <gpu>"
    return load_profile(request.param), root, gpus


# ---------------------------------------------------------------------------------------------
# The shipped set


def test_available_profiles_lists_exactly_the_shipped_ones():
    assert available_profiles() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_loads(name):
    p = load_profile(name)
    assert isinstance(p, GpuProfile)
    assert p.name == name
    if p.node.nvswitches == 0:
        assert p.node.nvswitch_device_id is None
    if p.nvlink.links == 0:
        assert p.nvlink.version == 0 and p.nvlink.link_speed_gbps == 0


@pytest.mark.parametrize("name", SHIPPED)
def test_profile_loads_by_path_too(name):
    path = Path(__file__).resolve().parents[1] / "profiles" / f"{name}.yaml"
    assert load_profile(str(path)) == load_profile(name)


# ---------------------------------------------------------------------------------------------
# Identity against the real captures


def test_identity_matches_capture(pair):
    p, _root, gpus = pair
    g = gpus[0]
    assert p.product_name == _text(g, "product_name")
    assert p.product_brand == _text(g, "product_brand")
    assert p.architecture == _text(g, "product_architecture")

    dev, ven = _hex_pair(_text(g, "pci/pci_device_id"))
    sdev, sven = _hex_pair(_text(g, "pci/pci_sub_system_id"))
    assert (p.pci.device_id, p.pci.vendor_id) == (dev, ven)
    assert (p.pci.subsystem_device_id, p.pci.subsystem_vendor_id) == (sdev, sven)
    base, sub = int(_text(g, "pci/pci_base_class"), 16), int(_text(g, "pci/pci_sub_class"), 16)
    assert p.pci.class_code == (base << 16) | (sub << 8)
    assert p.pci.max_link_gen == int(_num(g, "pci/pci_gpu_link_info/pcie_gen/max_link_gen"))
    assert p.pci.max_link_width == int(_num(g, "pci/pci_gpu_link_info/link_widths/max_link_width"))

    assert p.vbios_version == _text(g, "vbios_version")
    assert p.board_part_number == _text(g, "board_part_number")
    assert p.gpu_part_number == _text(g, "gpu_part_number")
    assert p.addressing_mode == _text(g, "addressing_mode")
    assert p.inforom.image == _text(g, "inforom_version/img_version")
    assert p.inforom.oem == _text(g, "inforom_version/oem_object")
    assert p.inforom.ecc == _text(g, "inforom_version/ecc_object")
    assert p.inforom.power == _text(g, "inforom_version/pwr_object")


def test_every_gpu_in_capture_is_the_same_board(pair):
    p, _root, gpus = pair
    for g in gpus:
        assert _text(g, "product_name") == p.product_name
        assert _hex_pair(_text(g, "pci/pci_device_id"))[0] == p.pci.device_id
        assert _num(g, "fb_memory_usage/total") == p.memory.total_mib


def test_memory_matches_capture(pair):
    p, _root, gpus = pair
    g = gpus[0]
    assert p.memory.total_mib == _num(g, "fb_memory_usage/total")
    assert p.memory.reserved_mib == _num(g, "fb_memory_usage/reserved")
    assert p.memory.bar1_mib == _num(g, "bar1_memory_usage/total")
    assert p.memory.bar1_used_mib == _num(g, "bar1_memory_usage/used")
    assert p.memory.ecc == (_text(g, "ecc_mode/current_ecc") == "Enabled")


def test_power_matches_capture(pair):
    p, _root, gpus = pair
    g = gpus[0]
    assert p.power.default_limit_w == _num(g, "gpu_power_readings/default_power_limit")
    assert p.power.min_limit_w == _num(g, "gpu_power_readings/min_power_limit")
    assert p.power.max_limit_w == _num(g, "gpu_power_readings/max_power_limit")
    idle = {
        _text(g, "gpu_power_readings/average_power_draw"),
        _text(g, "gpu_power_readings/instant_power_draw"),
    } - {"N/A"}
    assert p.power.idle_w in {round(float(v.split()[0]), 2) for v in idle}


def test_clocks_match_capture(pair):
    p, _root, gpus = pair
    g = gpus[0]
    assert p.clocks.max_graphics == _num(g, "max_clocks/graphics_clock")
    assert p.clocks.max_sm == _num(g, "max_clocks/sm_clock")
    assert p.clocks.max_mem == _num(g, "max_clocks/mem_clock")
    assert p.clocks.max_video == _num(g, "max_clocks/video_clock")
    assert p.clocks.idle_graphics == _num(g, "clocks/graphics_clock")
    assert p.clocks.idle_video == _num(g, "clocks/video_clock")
    default_gr = _text(g, "default_applications_clocks/graphics_clock")
    if default_gr.endswith("MHz"):  # newer drivers print "Requested functionality has been deprecated"
        assert p.clocks.default_app_graphics == _num(g, "default_applications_clocks/graphics_clock")
        assert p.clocks.default_app_mem == _num(g, "default_applications_clocks/mem_clock")


def test_thermal_matches_capture(pair):
    p, _root, gpus = pair
    g = gpus[0]
    assert p.thermal.idle_c == _num(g, "temperature/gpu_temp")
    mem = _text(g, "temperature/memory_temp")
    assert p.thermal.memory_idle_c == (None if mem == "N/A" else int(_num(g, "temperature/memory_temp")))
    tlimit = _text(g, "temperature/gpu_temp_tlimit")
    if tlimit == "N/A":  # absolute thresholds (Turing, Ampere)
        assert p.thermal.tlimit_c is None
        mem_max = _text(g, "temperature/gpu_temp_max_mem_threshold")
        assert p.thermal.memory_max_operating_c == (None if mem_max == "N/A" else _num(g, "temperature/gpu_temp_max_mem_threshold"))
        assert p.thermal.slowdown_c == _num(g, "temperature/gpu_temp_slow_threshold")
        assert p.thermal.shutdown_c == _num(g, "temperature/gpu_temp_max_threshold")
        assert p.thermal.max_operating_c == _num(g, "temperature/gpu_temp_max_gpu_threshold")
    else:  # margins to T.Limit (Ada, Hopper, Blackwell): absolute = T.Limit - margin
        assert p.thermal.tlimit_c == _num(g, "temperature/gpu_temp") + float(tlimit.split()[0])
        t = p.thermal.tlimit_c
        assert p.thermal.slowdown_c == t - _num(g, "temperature/gpu_temp_slow_tlimit_threshold")
        assert p.thermal.shutdown_c == t - _num(g, "temperature/gpu_temp_max_tlimit_threshold")
        assert p.thermal.max_operating_c == t - _num(g, "temperature/gpu_temp_max_gpu_tlimit_threshold")
        # Only a margin for memory, whose T.Limit reference is not printed: the absolute value is
        # inferred (docs/profiles.md); where there is no margin there is no threshold.
        if _text(g, "temperature/gpu_temp_max_mem_tlimit_threshold") == "N/A":
            assert p.thermal.memory_max_operating_c is None


def test_flags_and_node_match_capture(pair):
    p, root, gpus = pair
    g = gpus[0]
    assert p.has_fan == (_text(g, "fan_speed") != "N/A")
    assert p.fan_speed_pct == (None if not p.has_fan else _num(g, "fan_speed"))
    assert p.mig_capable == (_text(g, "mig_mode/current_mig") != "N/A")
    if _text(g, "fabric/state") == "N/A":
        assert p.fabric is None
    else:
        assert p.fabric is not None and p.fabric.state == _text(g, "fabric/state")
        assert _text(g, "fabric/status") == "Success"
        assert str(p.fabric.clique_id) == _text(g, "fabric/cliqueId")
        assert p.fabric.cluster_uuid == _text(g, "fabric/clusterUuid")
        h = p.fabric.health
        shown = {None: "N/A", True: "True", False: "False"}
        assert [shown.get(v, v) for v in (h.summary, h.bandwidth, h.route_recovery_in_progress, h.route_unhealthy,
                                          h.access_timeout_recovery, h.incorrect_configuration)] == [
            _text(g, f"fabric/health/{k}") for k in ("summary", "bandwidth", "route_recovery_in_progress",
                                                     "route_unhealthy", "access_timeout_recovery",
                                                     "incorrect_configuration")]
    assert p.node.driver_version == root.findtext("driver_version")
    assert p.node.cuda_version == root.findtext("cuda_version")
    assert p.node.pci_domain == int(_text(g, "pci/pci_domain"), 16)
    attached = int(root.findtext("attached_gpus"))
    if attached > 1:  # single-GPU captures are VMs or slices; the node default is documented
        assert p.node.gpus == attached


def test_h200_matches_reference_values():
    """No `-q -x` capture of an H200 is public: hold the values a real H200's default table shows."""
    p = load_profile("h200")
    assert p.product_name == "NVIDIA H200"
    assert p.memory.total_mib == 143771
    assert p.power.default_limit_w == 700
    assert p.pci.device_id == 0x2335
    assert p.architecture == "Hopper" and p.compute_capability == "9.0"
    assert (p.nvlink.links, p.nvlink.version) == (18, 4)


# ---------------------------------------------------------------------------------------------
# Broken profiles


def _valid_yaml() -> str:
    return (Path(__file__).resolve().parents[1] / "profiles" / "h100.yaml").read_text()


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    return path


def test_unknown_key_names_file_key_and_allowed_keys(tmp_path):
    text = _valid_yaml().replace("  max_link_width: 16", "  max_link_width: 16\n  max_lnk_gen: 5", 1)
    path = _write(tmp_path, text)
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    msg = str(e.value)
    assert str(path) in msg
    assert "pci.max_lnk_gen" in msg
    assert "unknown key" in msg
    for allowed in ("device_id", "max_link_gen", "max_link_width", "subsystem_device_id"):
        assert allowed in msg


def test_unknown_top_level_key(tmp_path):
    path = _write(tmp_path, _valid_yaml() + "colour: green\n")
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    msg = str(e.value)
    assert str(path) in msg and "colour" in msg and "product_name" in msg


def test_wrong_type_names_file_and_key(tmp_path):
    path = _write(tmp_path, _valid_yaml().replace("  total_mib: 81559", "  total_mib: lots", 1))
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    assert str(path) in str(e.value)
    assert "memory.total_mib" in str(e.value)


def test_missing_key_names_file_and_key(tmp_path):
    path = _write(tmp_path, _valid_yaml().replace("vbios_version: 96.00.99.00.01\n", "", 1))
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    assert str(path) in str(e.value)
    assert "vbios_version" in str(e.value)


def test_not_a_mapping(tmp_path):
    path = _write(tmp_path, "- just\n- a list\n")
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    assert str(path) in str(e.value) and "mapping" in str(e.value)


def test_bad_yaml(tmp_path):
    path = _write(tmp_path, "name: [unclosed\n")
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    assert str(path) in str(e.value) and "YAML" in str(e.value)


def test_profiles_parse_with_libyaml_and_keep_the_strict_rules(tmp_path):
    """Profiles and compositions are parsed by libyaml where PyYAML has it (the pure-Python
    parser cost 25-40 ms of every mount's start), with the same refusals: a key given twice,
    an over-long number, nesting past the parser's depth, each naming the file."""
    import yaml

    from mokkafs.model.profiles import StrictLoader

    if yaml.__with_libyaml__:
        assert issubclass(StrictLoader, yaml.CSafeLoader)
    for text, refusal in (("name: a\nname: b\n", "(line 2): duplicate key 'name'"),
                          ("name: " + "9" * 40 + "\n", "a number of 40 characters"),
                          ("name: " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
                          ("name:\n  " + "- " * 1500 + "x\n", "nested too deeply")):  # block style
        path = _write(tmp_path, text)
        with pytest.raises(ProfileError) as e:
            load_profile(str(path))
        assert str(path) in str(e.value) and refusal in str(e.value), str(e.value)[:200]


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    assert str(path) in str(e.value)


def test_unknown_profile_name_lists_shipped():
    with pytest.raises(ProfileError) as e:
        load_profile("v100")
    assert "v100" in str(e.value)
    for name in SHIPPED:
        assert name in str(e.value)


@pytest.mark.parametrize("bad, key", [
    ("  cluster_uuid: 00000000-0000-0000-0000-000000000000", "fabric.cluster_uuid"),
    ("  clique_id: 0", "fabric.clique_id"),
])
def test_a_bad_fabric_names_the_key(tmp_path, bad, key):
    replacement = {"fabric.cluster_uuid": "  cluster_uuid: not-a-uuid", "fabric.clique_id": "  clique_id: -1"}[key]
    path = _write(tmp_path, _valid_yaml().replace(bad, replacement, 1))
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    assert str(path) in str(e.value) and key in str(e.value)


@pytest.mark.parametrize("entries, words", [
    ("[{memory_mhz: 1593, graphics_max_mhz: 1980, graphics_min_mhz: 345}, "
     "{memory_mhz: 2619, graphics_max_mhz: 1980, graphics_min_mhz: 345}]", "highest first"),
    ("[{memory_mhz: 1593, graphics_max_mhz: 1980, graphics_min_mhz: 345}]", "must be max_mem"),
    ("[{memory_mhz: 2619, graphics_max_mhz: 2100, graphics_min_mhz: 345}]", "above max_graphics"),
    ("[{memory_mhz: 2619, graphics_max_mhz: 1980, graphics_min_mhz: 3450}]", "at most graphics_max_mhz"),
    ("[{memory_mhz: 2619, graphics_max_mhz: 1980, graphics_min_mhz: 345}]\n  graphics_step_mhz: 5",
     "clocks.graphics_step_mhz"),
    # 1980, the default applications graphics clock, is not on steps of 15 from 1972
    ("[{memory_mhz: 2619, graphics_max_mhz: 1972, graphics_min_mhz: 345}]", "default applications clocks"),
])
def test_bad_supported_clocks_are_refused_with_the_rule(tmp_path, entries, words):
    """clocks.supported lists what NVML will answer: memory clocks once each, highest (max_mem)
    first, graphics clocks within max_graphics and within what the shared state holds, the
    default applications clocks one of its pairs."""
    text = _valid_yaml()
    assert "\n  supported:" in text
    start = text.index("\n  supported:") + 1
    end = text.index("\n", text.index("\n    - {memory_mhz: 1593", start) + 1)
    path = _write(tmp_path, text[:start] + f"  supported: {entries}" + text[end:])
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    assert str(path) in str(e.value) and "clocks" in str(e.value) and words in str(e.value)


@pytest.mark.parametrize("line, key", [("voltage_mv: -5", "voltage_mv"), ("voltage_mv: 5000", "voltage_mv"),
                                       ("sparse_operation_mode: Maybe", "sparse_operation_mode")])
def test_a_bad_voltage_or_sparse_mode_names_the_key(tmp_path, line, key):
    text = _valid_yaml()
    start = text.index(f"\n{key}:") + 1
    path = _write(tmp_path, text[:start] + line + text[text.index("\n", start):])
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    assert str(path) in str(e.value) and key in str(e.value)


def test_an_unknown_fabric_health_value_is_refused(tmp_path):
    text = _valid_yaml().replace("  cluster_uuid: 00000000-0000-0000-0000-000000000000",
                                 "  cluster_uuid: 00000000-0000-0000-0000-000000000000\n  health:\n    summary: Fine", 1)
    path = _write(tmp_path, text)
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    assert "fabric.health.summary" in str(e.value) and "Healthy" in str(e.value)


@pytest.mark.parametrize("old, new, key, why", [
    ("  bar1_used_mib: 1 ", "  bar1_used_mib: 131073 ", "memory", "bar1_used_mib must be at most bar1_mib"),
    ("  bar1_used_mib: 1 ", "  bar1_used_mib: -1 ", "memory.bar1_used_mib", "greater than or equal to 0"),
    ("  memory_idle_c: 37", "  memory_idle_c: null", "thermal", "memory_max_operating_c needs memory_idle_c"),
    ("  state: Completed ", "  state: Done ", "fabric.state", "Completed"),
    ("has_fan: false", "has_fan: true", "(top level)", "fan_speed_pct is given exactly when has_fan"),
    ("has_fan: false", "has_fan: false\nfan_speed_pct: 30", "(top level)", "fan_speed_pct is given exactly"),
    ("has_fan: false", "has_fan: true\nfan_speed_pct: 101", "fan_speed_pct", "less than or equal to 100"),
])
def test_board_facts_the_publisher_used_to_make_up_are_checked(tmp_path, old, new, key, why):
    assert old in _valid_yaml()
    path = _write(tmp_path, _valid_yaml().replace(old, new, 1))
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    assert f"invalid profile: {key}: " in str(e.value) and why in str(e.value), str(e.value)


# ---- the driver branch a board needs ----------------------------------------------------------

# (profile, an older branch that cannot drive it, the first that can)
TOO_OLD = [("b200", "550.163.01", 570), ("gb200", "535.261.03", 570), ("gb300", "550.163.01", 570),
           ("h100", "470.256.02", 520), ("h200", "470.256.02", 520), ("l40s", "470.256.02", 525)]


@pytest.mark.parametrize("name, driver, first", TOO_OLD, ids=[f"{p}-{d}" for p, d, _ in TOO_OLD])
def test_a_node_refuses_a_driver_branch_that_cannot_drive_its_board(name, driver, first):
    from mokkafs.model import compose

    profile = load_profile(name)
    with pytest.raises(ProfileError) as e:
        compose(profile, driver_version=driver)
    assert f"driver {driver} cannot drive {profile.product_name}" in str(e.value)
    assert f"the first driver branch that can is R{first}" in str(e.value)
    # the first branch that can, and the profile's own driver, mount
    assert compose(profile, driver_version=f"{first}.0.1").driver_version == f"{first}.0.1"
    assert compose(profile).driver_version == profile.node.driver_version


def test_every_board_mounts_at_every_branch_from_its_first():
    from mokkafs.model import compose
    from mokkafs.model.schema import FIRST_BRANCH

    for name in SHIPPED:
        p = load_profile(name)
        first = FIRST_BRANCH[p.architecture]
        compose(p, driver_version=f"{first}.10.01")
        with pytest.raises(ProfileError):
            compose(p, driver_version=f"{first - 1}.10.01")


def test_a_profile_whose_own_driver_cannot_drive_it_is_refused(tmp_path):
    """Both ways a profile names its driver: a pinned driver on its composition, and the
    `node:` section of a profile written before compositions."""
    text = (Path(__file__).resolve().parents[1] / "profiles" / "b200.yaml").read_text()
    pinned = text.replace("composition: hgx-b200-8", "composition:\n  name: hgx-b200-8\n  driver_version: 535.261.03\n#", 1)
    old = (Path(__file__).resolve().parent / "fixtures" / "node_section_profiles" / "b200.yaml").read_text()
    default = load_profile_file(Path(__file__).resolve().parent / "fixtures" / "node_section_profiles" / "b200.yaml")
    old = old.replace(f"driver_version: {default.node.driver_version}", "driver_version: 535.261.03", 1)
    for name, body in (("pinned", pinned), ("node-section", old)):
        assert "535.261.03" in body
        (tmp_path / name).mkdir()
        path = _write(tmp_path / name, body)
        with pytest.raises(ProfileError) as e:
            load_profile(str(path))
        assert "driver_version 535.261.03 cannot drive a Blackwell board" in str(e.value) and "R570" in str(e.value)


def test_a_driver_version_that_is_not_one_is_refused():
    from mokkafs.model import compose

    with pytest.raises(ProfileError, match="does not look like 580.105.08"):
        compose(load_profile("t4"), driver_version="latest")
