"""nvidia-smi (shims/nvidia-smi) against the real captures, GPUtil, bad input and a lost GPU."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from helpers_nvml import Published, consumer_env, nvml_path
from mokkafs.model.events import SetProcesses
from mokkafs.model.profiles import load_profile
from helpers_smi import (CAPTURES, TEXT_H100, TEXT_L40S, XML_PROFILES, capture_section, element_paths, shape,
                         smi_binary)

pytestmark = pytest.mark.level("shims")


@pytest.fixture(scope="session")
def smi(tmp_path_factory) -> Path:
    nvml_path()
    return smi_binary(tmp_path_factory)


@pytest.fixture
def node(tmp_path, request):
    """A published node (no mount); parametrize indirectly with (profile, gpus)."""
    profile, gpus = getattr(request, "param", ("h100", 8))
    p = Published(tmp_path, profile, gpus)
    yield p
    p.close()


def run(smi: Path, node, *args: str, timeout: float = 10) -> subprocess.CompletedProcess:
    return subprocess.run([str(smi), *args], env=consumer_env(node.path), capture_output=True, text=True,
                          timeout=timeout)


# --- slice 1: -L, --version, -h, the default table, no driver -------------------------------


def test_list_and_version(smi, node):
    r = run(smi, node, "-L")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert len(lines) == 8
    assert re.fullmatch(r"GPU 0: NVIDIA H100 80GB HBM3 \(UUID: GPU-[0-9a-f-]{36}\)", lines[0])
    v = run(smi, node, "--version").stdout.splitlines()
    assert v == ["NVIDIA-SMI version  : 580.105.08", "NVML version        : 580.105",
                 "DRIVER version      : 580.105.08", "CUDA Version        : 13.0"]


def test_help_is_the_real_text(smi, node):
    r = run(smi, node, "-h")
    assert r.returncode == 0
    # headed by the driver's version, as the real tool by its own (580 here; the capture is 590's)
    help_text = capture_section(TEXT_H100, "capabilities :: help (-h)")
    assert r.stdout.splitlines() == ["NVIDIA System Management Interface -- v580.105.08", *help_text[1:]]
    r = run(smi, node, "--help-query-gpu")
    assert r.stdout.splitlines() == capture_section(TEXT_H100, "capabilities :: help-query-gpu")


@pytest.mark.parametrize("node,capture,section", [(("h100", 1), TEXT_H100, "load :: nvidia-smi (default table)"),
                                                  (("l40s", 1), TEXT_L40S, "idle :: nvidia-smi (default table)")],
                         indirect=["node"], ids=["h100-590", "l40s-595"])
def test_default_table_matches_the_capture_layout(smi, node, capture, section):
    """Every line of the one-GPU capture has the same shape (widths, separators) as ours."""
    ours = run(smi, node, "-i", "0").stdout.splitlines()
    real = capture_section(capture, section)
    # Persistence-M is the one left-aligned value: align the state before comparing ends
    persistence = {l[38:41] for l in real if re.match(r"\|   0  ", l)}.pop()
    ours = [l[:38] + persistence + l[41:] if re.match(r"\|   0  ", l) else l for l in ours]
    # the process rows differ (the capture ran a load): compare up to the process header
    cut = real.index("|=========================================================================================|")
    assert [shape(l) for l in ours[1:cut + 1] if "NVIDIA-SMI" not in l] == \
        [shape(l) for l in real[1:cut + 1] if "NVIDIA-SMI" not in l]
    assert ours[cut + 1] == "|  No running processes found                                                             |"
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}       ", ours[0])


def test_default_table_columns(smi, node):
    out = run(smi, node).stdout.splitlines()
    assert out[2] == "| NVIDIA-SMI 580.105.08             Driver Version: 580.105.08     CUDA Version: 13.0     |"
    rows = [l for l in out if re.match(r"\|\s+\d  NVIDIA", l)]
    assert len(rows) == 8
    assert rows[0].startswith("|   0  NVIDIA H100 80GB HBM3          On  |   00000000:")
    assert re.fullmatch(r"\| N/A +\d+C +P0 +\d+W /  700W \| +\d+MiB /  81559MiB \| +\d+% +Default \|",
                        out[out.index(rows[0]) + 1])
    assert all(len(l) == 91 for l in out[1:] if l)


@pytest.mark.parametrize("node", [("h100", 1), ("h200", 1)], indirect=True, ids=["590", "550"])
def test_process_rows_are_the_frame_wide_and_named_by_argv0(smi, node, tmp_path):
    """A process row is as wide as the frame (91), and names the process by argv[0] as it was
    started ("/root/tools/memhog", "./gpu_burn" in the captures), not by its comm ("sleep"); a
    name longer than its column keeps its tail behind "..."."""
    long_name = "/opt/training/checkpoints/run-2026-12-03/bin/trainer"
    procs = [subprocess.Popen(["/bin/sleep", "30"]),
             subprocess.Popen(["bash", "-c", f"exec -a {long_name} sleep 30"])]
    try:
        deadline = time.monotonic() + 5  # until bash has exec'd: its argv[0] is the long name
        while Path(f"/proc/{procs[1].pid}/cmdline").read_bytes().split(b"\0")[0] != long_name.encode():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        node.apply(SetProcesses(0, tuple((p.pid, (100 + k) << 20) for k, p in enumerate(procs))))
        out = run(smi, node).stdout.splitlines()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    rows = {p.pid: next(l for l in out if re.match(rf"\|    0 +N/A +N/A +{p.pid} ", l)) for p in procs}
    assert [l for l in out if l[:1] and l[:1] in "|+" and len(l) != 91] == []
    width = 36 if "Process name                        GPU" in "".join(out) else 42
    assert rows[procs[0].pid].split()[6] == "/bin/sleep"
    name = rows[procs[1].pid][-(width + 12):-12]
    assert name == "..." + long_name[-(width - 3):]
    assert "sleep" not in "".join(rows.values()).replace("/bin/sleep", "")


@pytest.mark.parametrize("node", [("h200", 1)], indirect=True)
def test_550_branch_table_uses_pipes_under_the_header(smi, node):
    out = run(smi, node).stdout.splitlines()
    assert out[3].startswith("|-----") and out[3].endswith("-+")
    assert "|  GPU   GI   CI        PID   Type   Process name" in r"".join(out)


def test_no_driver(smi, tmp_path):
    env = consumer_env(tmp_path / "absent")
    for args in ([], ["-L"], ["-q"], ["--query-gpu=index", "--format=csv"]):
        r = subprocess.run([str(smi), *args], env=env, capture_output=True, text=True, timeout=10)
        assert r.returncode == 9
        assert r.stdout == ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                            "Make sure that the latest NVIDIA driver is installed and running.\n")


def test_no_library(smi, tmp_path):
    r = subprocess.run([str(smi)], env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path)},
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 12
    assert r.stdout.startswith("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.")


@pytest.mark.parametrize("args", [["--bogus"], ["-i"], ["--query-gpu=index"], ["--query-gpu=index", "--format=xml"],
                                  ["-q", "-d", "NOPE"], ["-q", "-d"], ["-q", "-d", ",,"], ["-lms", "0"], ["-l", "x"], ["frobnicate"],
                                  ["dmon", "-c", "-1"], ["--query-gpu=", "--format=csv"]])
def test_bad_arguments_are_exit_2(smi, node, args):
    r = run(smi, node, *args)
    assert r.returncode == 2, r.stdout
    assert r.stdout == "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"


def test_bad_field_names_the_field(smi, node):
    r = run(smi, node, "--query-gpu=index,nonsense", "--format=csv")
    assert r.returncode == 2
    assert r.stdout.startswith('Field "nonsense" is not a valid field to query.')


@pytest.mark.parametrize("ids", ["8", "99", "GPU-nope", "ff:00.0", "0,42", "99999999999999999999"])
def test_unknown_ids(smi, node, ids):
    r = run(smi, node, "-L", "-i", ids)
    assert (r.returncode, r.stdout) == (6, "No devices were found\n")


# --- slice 2: --query-gpu, -i, --query-compute-apps, loops, GPUtil --------------------------


def _capture_query(capture: Path) -> tuple[str, list[str], list[str]]:
    title = "idle :: query-gpu (csv, what the exporter parses)"
    lines = capture.read_text().splitlines()
    cmd = lines[lines.index(f"# {title}") + 1]
    fields = re.search(r"--query-gpu=(\S+)", cmd).group(1)
    body = capture_section(capture, title)
    return fields, body[0].split(", "), body[1].split(", ")


def test_every_query_field_with_the_real_header(smi, node):
    fields, header, values = _capture_query(TEXT_H100)
    r = run(smi, node, "-i", "0", f"--query-gpu={fields}", "--format=csv")
    assert r.returncode == 0
    ours = r.stdout.splitlines()
    assert ours[0].split(", ") == header
    row = dict(zip(header, ours[1].split(", ")))
    real = dict(zip(header, values))
    assert len(row) == len(real) == 212
    for key in ["name", "pci.device_id", "pci.sub_device_id", "memory.total [MiB]", "power.max_limit [W]",
                "clocks.max.memory [MHz]", "compute_cap", "pstate", "pcie.link.gen.max", "pcie.link.width.max",
                "display_mode", "clocks.applications.graphics [MHz]" if False else "count"]:
        if key != "count":
            assert row[key] == real[key], key
    assert row["count"] == "8"
    assert row["clocks_event_reasons.supported"] == "0x00000000000001FF"
    assert re.fullmatch(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{3}", row["timestamp"])
    assert all(re.fullmatch(r"\d+\.\d\d W", row[k]) for k in ("power.draw [W]", "power.limit [W]"))
    unavailable = [k for k, v in row.items() if v.startswith("[")]
    assert all(row[k] in ("[N/A]", "[Requested functionality has been deprecated]") for k in unavailable)


def test_aliases_nounits_noheader(smi, node):
    r = run(smi, node, "--query-gpu=gpu_name,gpu_bus_id,clocks.gr,memory.total,clocks_throttle_reasons.active",
            "--format=csv,noheader,nounits", "-i", "1")
    (line,) = r.stdout.splitlines()
    name, bus, gr, total, active = line.split(", ")
    assert (name, total) == ("NVIDIA H100 80GB HBM3", "81559")
    assert re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", bus) and gr.isdigit() and active.startswith("0x")
    header = run(smi, node, "--query-gpu=clocks.gr,memory.total", "--format=csv,nounits").stdout.splitlines()[0]
    assert header == "clocks.current.graphics [MHz], memory.total [MiB]"  # as real 470-550 print it


def test_select_by_index_uuid_and_bus_id(smi, node):
    uuids = run(smi, node, "--query-gpu=uuid,pci.bus_id", "--format=csv,noheader").stdout.splitlines()
    u3, b3 = uuids[3].split(", ")
    legacy = b3[4:]
    for ids in ("3", u3, b3, legacy, legacy.lower(), b3[9:]):
        out = run(smi, node, "--query-gpu=index", "--format=csv,noheader", "-i", ids).stdout
        assert out == "3\n", ids
    out = run(smi, node, "--query-gpu=index", "--format=csv,noheader", "--id=5,1").stdout
    assert out == "1\n5\n"


def test_compute_apps_header_and_empty_list(smi, node):
    fields = "timestamp,gpu_name,gpu_bus_id,gpu_serial,gpu_uuid,pid,process_name,used_gpu_memory"
    r = run(smi, node, f"--query-compute-apps={fields}", "--format=csv")
    assert r.stdout.splitlines() == capture_section(TEXT_H100, "idle :: query-compute-apps (per-process)")


CAPTURED = [("h100", "590.48.01", TEXT_H100), ("l40s", "595.80", TEXT_L40S)]


@pytest.fixture
def captured(tmp_path, request):
    """A one-GPU node of a text capture's board at its driver: (node, capture)."""
    profile, driver, capture = request.param
    p = Published(tmp_path, profile, 1, driver)
    yield p, capture
    p.close()


@pytest.mark.parametrize("captured", CAPTURED, indirect=True, ids=["590", "595"])
def test_help_texts_are_the_captured_branch(smi, captured):
    """-h and every --help-query-* text the capture has are its branch's, verbatim (595 lists
    kmd_version, the inactive remapped rows and fabric.health.partition_assigned and drops
    power smoothing; accounted apps and retired pages have help texts at both)."""
    node, capture = captured
    for option, title in [("-h", "help (-h)"), ("--help-query-gpu", "help-query-gpu"),
                          ("--help-query-compute-apps", "help-query-compute-apps"),
                          ("--help-query-accounted-apps", "help-query-accounted-apps"),
                          ("--help-query-retired-pages", "help-query-retired-pages")]:
        r = run(smi, node, option)
        assert r.returncode == 0, option
        assert r.stdout.splitlines() == capture_section(capture, f"capabilities :: {title}"), option


@pytest.mark.parametrize("captured", CAPTURED, indirect=True, ids=["590", "595"])
def test_query_gpu_takes_the_captured_branch_fields(smi, captured):
    """The capture's own --query-gpu command prints its header; each branch refuses what the
    other added (595: kmd_version ...; 590: power smoothing), as the real tool refuses a field its
    --help-query-gpu does not list."""
    node, capture = captured
    fields, header, values = _capture_query(capture)
    r = run(smi, node, f"--query-gpu={fields}", "--format=csv")
    assert r.returncode == 0, r.stdout[-300:]
    assert r.stdout.splitlines()[0].split(", ") == header
    row = dict(zip(header, r.stdout.splitlines()[1].split(", ")))
    driver = dict(zip(header, values))["driver_version"]
    assert row["driver_version"] == driver
    if "kmd_version" in row:
        assert row["kmd_version"] == driver and row["fabric.health.partition_assigned"] == "N/A"
        assert row["remapped_rows.correctable_inactive"] == row["remapped_rows.uncorrectable_inactive"] == "0"
    other = "power_smoothing.primary_power_floor" if "kmd_version" in row else "kmd_version"
    r = run(smi, node, f"--query-gpu={other}", "--format=csv")
    assert (r.returncode, r.stdout) == (2, f'Field "{other}" is not a valid field to query.\n\n')


@pytest.mark.parametrize("captured", CAPTURED, indirect=True, ids=["590", "595"])
def test_accounted_apps_and_retired_pages_as_captured(smi, captured):
    """The capture's --query-accounted-apps and --query-retired-pages commands: the same header,
    and for a board that remaps rows (no page retirement) one [N/A] row per cause, the GPU's
    cells masked."""
    node, capture = captured
    for title, option in [("idle :: query-accounted-apps", "--query-accounted-apps"),
                          ("idle :: query-retired-pages", "--query-retired-pages")]:
        lines = capture.read_text().splitlines()
        fields = re.search(rf"{option}=(\S+)", lines[lines.index(f"# {title}") + 1]).group(1)
        real = capture_section(capture, title)
        r = run(smi, node, f"{option}={fields}", "--format=csv")
        assert r.returncode == 0, (option, r.stdout)
        ours = r.stdout.splitlines()
        assert ours[0] == real[0], option
        if option == "--query-retired-pages":
            mask = lambda line: line.split(", ", 5)[5]  # noqa: E731 (after timestamp, name, bus, serial, UUID)
            assert [mask(l) for l in ours[1:]] == [mask(l) for l in real[1:]]
            assert ours[1].split(", ")[1] == real[1].split(", ")[1]  # the product name


@pytest.mark.parametrize("captured", CAPTURED, indirect=True, ids=["590", "595"])
def test_values_the_captures_give(smi, captured):
    """Values real boards give that the tool used to print N/A: InfoROM checksum validation, GSP
    mode (current and default), the bank remap histogram; EDPp as the capture spells it in CSV and
    in -q ("100.00%", no space, on the H100; N/A on the L40S)."""
    node, capture = captured
    fields, header, values = _capture_query(capture)
    real = dict(zip(header, values))
    names = ["inforom.checksum_validation", "gsp.mode.current", "gsp.mode.default", "edpp_multiplier [%]",
             *(f"remapped_rows.histogram.{b}" for b in ("max", "high", "partial", "low", "none"))]
    r = run(smi, node, f"--query-gpu={fields}", "--format=csv")
    row = dict(zip(header, r.stdout.splitlines()[1].split(", ")))
    assert {k: row[k] for k in names} == {k: real[k] for k in names}
    edpp = lambda lines: next(l for l in lines if l.startswith("    EDPp Multiplier"))  # noqa: E731
    assert edpp(run(smi, node, "-q").stdout.splitlines()) == edpp(capture_section(capture, "idle :: query (-q)"))


@pytest.mark.parametrize("profile,capture", [("h100-nvl", "nvidia-smi-q.h100-nvl.550.54.14.txt"),
                                             ("a100-80gb", "nvidia-smi-q.a100-80gb.555.42.02.txt"),
                                             ("l4", "nvidia-smi-q.l4.550.90.07.txt"),
                                             ("a10g", "nvidia-smi-q.a10g.535.247.01.txt")])
def test_remap_histogram_of_the_text_boards(smi, tmp_path, profile, capture):
    """The boards shipped from a text -q print their bank remap histogram, as that -q does."""
    p = Published(tmp_path, profile, 1)
    try:
        ours = run(smi, p, "-q").stdout.splitlines()
    finally:
        p.close()
    real = (CAPTURES / capture).read_text().splitlines()
    hist = lambda lines: [l.split(" : ")[1] for l in lines[lines.index(  # noqa: E731
        next(l for l in lines if l.strip() == "Bank Remap Availability Histogram")) + 1:][:5]]
    assert hist(ours) == hist(real) and hist(ours)[0].endswith(" bank(s)")


VOLTAGE_BOARDS = [("h100-nvl", "nvidia-smi-q.h100-nvl.550.54.14.txt", "550.54.14"),
                  ("a100-80gb", "nvidia-smi-q.a100-80gb.555.42.02.txt", "555.42.02"),
                  ("l4", "nvidia-smi-q.l4.550.90.07.txt", "550.90.07"),
                  ("a10g", "nvidia-smi-q.a10g.535.247.01.txt", "535.247.01"),
                  ("h100", "nvidia-smi-q.h100.565.57.01.txt", "565.57.01")]


@pytest.mark.parametrize("profile,capture,driver", VOLTAGE_BOARDS, ids=[b[0] for b in VOLTAGE_BOARDS])
def test_voltage_and_sparse_mode_as_the_text_captures(smi, tmp_path, profile, capture, driver):
    """-q's Sparse Operation Mode and Voltage/Graphics (values NVML has no getter for) are the
    board's, as its real -q at that driver prints them (GPU 0's voltage), in -q -d VOLTAGE too."""
    p = Published(tmp_path, profile, 1, driver)
    try:
        ours = run(smi, p, "-q").stdout.splitlines()
        section = run(smi, p, "-q", "-d", "VOLTAGE").stdout.splitlines()
    finally:
        p.close()
    real = (CAPTURES / capture).read_text().splitlines()
    pick = lambda lines: [lines[i + k] for i, l in enumerate(lines)  # noqa: E731
                          if l.strip() in ("Sparse Operation Mode", "Voltage") or l.startswith("    Sparse Operation Mode")
                          for k in ((0,) if "Sparse" in l else (0, 1))][:3]
    assert pick(ours) == pick(real)
    assert pick(ours)[2].endswith(" mV") and pick(section) == pick(ours)[1:]


@pytest.mark.parametrize("profile,driver,sparse,text_volt,xml_volt", [
    ("h100", "565.57.01", "Disabled", "685.000 mV", "685.000 mV"),  # the 565 capture's GPU 0
    # 570: -q is the 590 capture's (no Voltage); -q -x the board's capture (H100: 580's, no voltage)
    # or, without one, the A100's 570 capture, whose voltage is N/A: the 80GB A100 has a value at 555
    ("h100", "570.124.06", "Disabled", None, None),
    ("a100-80gb", "570.148.08", "N/A", None, "N/A"),
    ("h100", "590.48.01", "Disabled", None, None),                  # no Voltage from 580 (the captures)
    ("h200", "550.90.12", "Disabled", "N/A", "N/A"),                # Hopper's mode; no capture of its voltage
    ("l40s", "550.127.05", "N/A", "875.000 mV", "875.000 mV"),      # a real L40S -q at 550.127.05
    ("t4", "595.91.07", "N/A", None, None),
])
def test_voltage_and_sparse_mode_by_branch(smi, tmp_path, profile, driver, sparse, text_volt, xml_volt):
    p = Published(tmp_path, profile, 1, driver)
    try:
        text = run(smi, p, "-q").stdout.splitlines()
        xml = run(smi, p, "-q", "-x").stdout
    finally:
        p.close()
    assert next(l for l in text if "Sparse Operation Mode" in l).split(" : ")[1] == sparse
    assert f"<sparse_operation_mode>{sparse}</sparse_operation_mode>" in xml
    assert (text[text.index("    Voltage") + 1].split(" : ")[1] if "    Voltage" in text else None) == text_volt
    found = re.search(r"<graphics_volt>(.*)</graphics_volt>", xml)
    assert (found and found.group(1)) == xml_volt


@pytest.mark.parametrize("profile", XML_PROFILES)
def test_supported_clocks_are_the_captures(smi, tmp_path, profile):
    """-q -x's <supported_clocks> at the capture's driver is the capture's, byte for byte: every
    memory clock with every graphics clock (7.5 MHz steps rounded down on Blackwell)."""
    text = (CAPTURES / f"nvidia-smi-q-x.{profile}.xml").read_text()
    driver = re.search(r"<driver_version>([^<]+)<", text).group(1)
    block = lambda t: t[t.index("<supported_clocks>"):t.index("</supported_clocks>")]  # noqa: E731
    p = Published(tmp_path, profile, 1, driver)
    try:
        ours = run(smi, p, "-q", "-x").stdout
        section = run(smi, p, "-q", "-d", "SUPPORTED_CLOCKS").stdout.splitlines()
    finally:
        p.close()
    assert block(ours) == block(text) and block(ours).count("<supported_graphics_clock>") > 80
    # -q -d SUPPORTED_CLOCKS (from 570 no capture shows it: the 470-550 binaries' layout)
    real = [(m, g) for m, g in re.findall(r"<value>(\d+ MHz)</value>((?:\s*<supported_graphics_clock>[^<]+<"
                                          r"/supported_graphics_clock>)+)", block(text))]
    body = section[section.index("    Supported Clocks"):]
    assert [l.split(" : ")[1] for l in body if l.startswith("        Memory ")] == [m for m, _ in real]
    assert [l.split(" : ")[1] for l in body if l.startswith("            Graphics ")] == \
        [g for _, gs in real for g in re.findall(r"<supported_graphics_clock>([^<]+)<", gs)]


def test_a_board_without_supported_clocks_prints_na(smi, tmp_path):
    """A profile that lists no supported clocks: NVML answers NOT_SUPPORTED, and nvidia-smi prints
    N/A where NVIDIA's binaries print it for such a board (their records: <supported_clocks>N/A)."""
    data = load_profile("l40s").model_dump(mode="json")
    data["clocks"]["supported"] = []
    path = tmp_path / "bare.yaml"
    path.write_text(json.dumps(data))
    p = Published(tmp_path, str(path), 1, "550.163.01")
    try:
        xml = run(smi, p, "-q", "-x").stdout
        text = run(smi, p, "-q", "-d", "SUPPORTED_CLOCKS").stdout
    finally:
        p.close()
    assert "\t\t<supported_clocks>N/A</supported_clocks>\n" in xml
    assert re.search(r"\n    Supported Clocks +: N/A\n", text)


CUDA_PROBE = """
import ctypes, json, os
nvml = ctypes.CDLL("libnvidia-ml.so.1"); assert nvml.nvmlInit_v2() == 0
cu = ctypes.CDLL(os.environ["MOKKA_CUDA_LIB"]); assert cu.cuInit(0) == 0
a, b = ctypes.c_int(), ctypes.c_int()
v = ctypes.create_string_buffer(80)
nvml.nvmlSystemGetCudaDriverVersion(ctypes.byref(a)); cu.cuDriverGetVersion(ctypes.byref(b))
nvml.nvmlSystemGetNVMLVersion(v, 80)
print(json.dumps([a.value, b.value, v.value.decode()]))
"""


@pytest.mark.parametrize("driver,cuda", [("535.261.03", "12.2"), ("550.54.15", "12.4"), ("565.57.01", "12.7"),
                                         ("575.57.08", "12.9"), ("590.48.01", "13.1"), ("595.80", "13.2")])
def test_the_cuda_version_follows_the_driver(smi, tmp_path, driver, cuda):
    """A node mounted at a driver version without a CUDA version reports that branch's CUDA on
    every surface: the table's header, -q, -q -x, NVML (version and NVML version's major), libcuda."""
    from mokkafs.render import native

    p = Published(tmp_path, "h100", 1, driver)
    try:
        table = run(smi, p).stdout
        query = run(smi, p, "-q").stdout
        xml = run(smi, p, "-q", "-x").stdout
        env = consumer_env(p.path) | {"MOKKA_CUDA_LIB": str(native.cuda_library())}
        probe = subprocess.run([sys.executable, "-c", CUDA_PROBE], env=env, capture_output=True, text=True, timeout=60)
    finally:
        p.close()
    assert re.search(rf"Driver Version: {re.escape(driver)} +CUDA Version: {re.escape(cuda)} ", table)
    assert re.search(rf"\nCUDA Version +: {re.escape(cuda)}\n", query)
    assert f"<cuda_version>{cuda}</cuda_version>" in xml
    major, minor = (int(x) for x in cuda.split("."))
    assert json.loads(probe.stdout) == [major * 1000 + minor * 10] * 2 + [f"{major}.{driver}"], probe.stderr


def test_loop_ms_repeats_rows_until_interrupted(smi, node):
    p = subprocess.Popen([str(smi), "--query-gpu=index", "--format=csv,noheader", "-i", "0", "-lms", "20"],
                         env=consumer_env(node.path), stdout=subprocess.PIPE, text=True)
    import time

    time.sleep(0.5)
    p.send_signal(2)
    out, _ = p.communicate(timeout=5)
    assert p.returncode == 0
    assert out.count("0\n") >= 5 and set(out.splitlines()) == {"0"}


def test_gputil_parses_our_csv(smi, node, tmp_path):
    pytest.importorskip("GPUtil", reason="pip install gputil")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").symlink_to(smi)
    env = consumer_env(node.path)
    env["PATH"] = f"{bindir}:{env['PATH']}"
    code = ("import GPUtil, json; print(json.dumps([(g.id, g.uuid, g.name, g.memoryTotal, g.memoryUsed, g.load,"
            " g.temperature, g.driver, g.display_mode) for g in GPUtil.getGPUs()]))")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    import json

    gpus = json.loads(r.stdout)
    assert [g[0] for g in gpus] == list(range(8))
    uuids = run(smi, node, "--query-gpu=uuid", "--format=csv,noheader").stdout.split()
    assert [g[1] for g in gpus] == uuids
    assert {(g[2], g[3], g[7]) for g in gpus} == {("NVIDIA H100 80GB HBM3", 81559.0, "580.105.08")}
    assert all(0 <= g[5] <= 1 and 0 < g[6] < 120 for g in gpus)


# --- slice 3: -q, -q -d, -q -x ----------------------------------------------------------------

IDENTITY = ["product_name", "product_brand", "product_architecture", "vbios_version", "board_part_number",
            "gpu_part_number",
            "inforom_version/img_version", "inforom_version/oem_object", "inforom_version/ecc_object",
            "pci/pci_device_id", "pci/pci_sub_system_id", "pci/pci_gpu_link_info/pcie_gen/max_link_gen",
            "pci/pci_gpu_link_info/link_widths/max_link_width", "fb_memory_usage/total", "bar1_memory_usage/total",
            "gpu_power_readings/default_power_limit", "gpu_power_readings/min_power_limit",
            "gpu_power_readings/max_power_limit", "max_clocks/graphics_clock", "max_clocks/sm_clock",
            "max_clocks/mem_clock", "max_clocks/video_clock", "ecc_mode/current_ecc",
            "fabric/state", "fabric/status", "fabric/cliqueId", "fabric/clusterUuid", "fabric/health/summary",
            "fabric/health/bandwidth", "fabric/health/route_recovery_in_progress", "fabric/health/route_unhealthy",
            "fabric/health/access_timeout_recovery", "fabric/health/incorrect_configuration",
            "fabric/health/partition_assigned"]


THRESHOLDS = [f"temperature/gpu_temp_{t}_threshold" for t in
              ("max", "slow", "max_gpu", "max_mem", "max_tlimit", "slow_tlimit", "max_gpu_tlimit", "max_mem_tlimit")]


@pytest.mark.parametrize("node", [(p, 1) for p in XML_PROFILES], indirect=True, ids=XML_PROFILES)
def test_xml_matches_the_capture(smi, node, request):
    profile = request.node.callspec.params["node"][0]
    r = run(smi, node, "-q", "-x")
    assert r.returncode == 0
    text = r.stdout
    cap_text = (CAPTURES / f"nvidia-smi-q-x.{profile}.xml").read_text()
    assert text.splitlines()[:2] == cap_text.splitlines()[:2]  # the XML declaration and the branch's DTD
    ours, real = ET.fromstring(text), ET.fromstring(cap_text)
    assert [c.tag for c in ours] == ["timestamp", "driver_version", "cuda_version", "attached_gpus", "gpu"]
    assert ours.findtext("driver_version") == real.findtext("driver_version")
    og, rg = ours.find("gpu"), real.find("gpu")
    assert element_paths(og) == element_paths(rg)
    for path in IDENTITY:
        assert og.findtext(path) == rg.findtext(path), path
    # the board's thresholds, absolute (A100, T4) or relative to T.Limit (Ada and later), and how
    # it addresses system memory: fixed per board, so equal to the capture's
    for path in THRESHOLDS + ["addressing_mode"]:
        if rg.find(path) is not None:
            assert og.findtext(path) == rg.findtext(path), path
    assert text.endswith("\t</gpu>\n\n</nvidia_smi_log>\n")


def test_xml_display_sections(smi, node):
    root = ET.fromstring(run(smi, node, "-q", "-x", "-d", "MEMORY,TEMPERATURE", "-i", "0").stdout)
    assert [c.tag for c in root.find("gpu")] == ["fb_memory_usage", "bar1_memory_usage",
                                                "cc_protected_memory_usage", "temperature"]


@pytest.mark.parametrize("node,capture", [(("h100", 1), TEXT_H100), (("l40s", 1), TEXT_L40S)],
                         indirect=["node"], ids=["590", "595"])
def test_query_text_matches_the_capture_layout(smi, node, capture):
    ours = run(smi, node, "-q").stdout.splitlines()
    real = capture_section(capture, "idle :: query (-q)")
    label = lambda l: l[:57] if len(l) > 55 and l[55] == ":" else l  # noqa: E731
    gpu_line = lambda lines: next(i for i, l in enumerate(lines) if l.startswith("GPU 0000"))  # noqa: E731
    assert [label(l) for l in ours[:gpu_line(ours)]] == [label(l) for l in real[:gpu_line(real)]]
    assert [label(l) for l in ours[gpu_line(ours) + 1:-1]] == [label(l) for l in real[gpu_line(real) + 1:]]
    assert ours[1] == "==============NVSMI LOG=============="
    for want in ["    Product Name                                       : NVIDIA ",
                 "        Total                                          : "]:
        assert any(l.startswith(want) for l in ours)


def _q_values(lines: list[str], section: str) -> dict[str, str]:
    """label -> value of the `-q` lines directly under one top-level header of the first GPU."""
    i = lines.index(f"    {section}")
    out = {}
    for l in lines[i + 1:]:
        if not l.startswith("        ") or l.startswith("            "):
            break
        out[l[:55].strip()] = l[57:]
    return out


@pytest.mark.parametrize("node,capture", [(("h100", 1), TEXT_H100), (("l40s", 1), TEXT_L40S)],
                         indirect=["node"], ids=["590", "595"])
def test_query_text_thresholds_and_addressing_mode(smi, node, capture):
    """The T.Limit-relative thresholds the captures print (H100 -8/-2/0, memory 0; L40S -5/-2/0, no
    memory T.Limit), and the board's addressing mode (its -q -x capture: HMM on both)."""
    ours = run(smi, node, "-q").stdout.splitlines()
    real = capture_section(capture, "idle :: query (-q)")
    varying = {"GPU Current Temp", "GPU T.Limit Temp", "Memory Current Temp"}
    want = {k: v for k, v in _q_values(real, "Temperature").items() if k not in varying}
    got = _q_values(ours, "Temperature")
    assert {k: got[k] for k in want} == want
    mode = next(l for l in ours if l.startswith("    Addressing Mode "))
    assert mode == f"    {'Addressing Mode':51}: HMM"


@pytest.mark.parametrize("node", [("a100", 1), ("t4", 1)], indirect=True, ids=["a100", "t4"])
def test_query_text_absolute_thresholds_before_ada(smi, node, request):
    """A board without a T.Limit prints its absolute thresholds where the T.Limit ones would be,
    the values its -q -x capture has."""
    profile = request.node.callspec.params["node"][0]
    got = _q_values(run(smi, node, "-q").stdout.splitlines(), "Temperature")
    cap = ET.parse(CAPTURES / f"nvidia-smi-q-x.{profile}.xml").getroot().find("gpu/temperature")
    assert list(got) == ["GPU Current Temp", "GPU T.Limit Temp", "GPU Shutdown Temp", "GPU Slowdown Temp",
                         "GPU Max Operating Temp", "GPU Target Temperature", "Memory Current Temp",
                         "Memory Max Operating Temp"]
    assert got["GPU T.Limit Temp"] == "N/A"
    for label, tag in [("GPU Shutdown Temp", "gpu_temp_max_threshold"), ("GPU Slowdown Temp", "gpu_temp_slow_threshold"),
                       ("GPU Max Operating Temp", "gpu_temp_max_gpu_threshold"),
                       ("Memory Max Operating Temp", "gpu_temp_max_mem_threshold")]:
        assert got[label] == cap.findtext(tag), label


def test_query_display_sections(smi, node):
    out = run(smi, node, "-q", "-d", "MEMORY", "-i", "0").stdout.splitlines()
    assert out[8].startswith("GPU 00000000:")
    assert out[9:] == [
        "    FB Memory Usage",
        out[10], out[11], out[12], out[13],
        "    BAR1 Memory Usage", out[15], out[16], out[17],
        "    Conf Compute Protected Memory Usage", out[19], out[20], out[21], ""]
    assert out[10].startswith("        Total ") and out[10].endswith(": 81559 MiB")


# --- slice 4: topo, nvlink, dmon, pmon ----------------------------------------------------------


def test_topo_matrix(smi, node):
    out = run(smi, node, "topo", "-m").stdout.splitlines()
    assert out[0] == "\t\x1b[4m" + "".join(f"GPU{i}\t" for i in range(8)) + "CPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    row = out[1].split("\t")
    assert row[0] == "GPU0" and row[1] == " X " and all(c.startswith("NV") or c in ("PIX", "PXB", "PHB", "NODE", "SYS")
                                                        for c in row[2:9])
    assert out[10] == "Legend:"


@pytest.mark.parametrize("node", [("l40s", 1)], indirect=True)
def test_topo_single_gpu_like_the_capture(smi, node):
    ours = run(smi, node, "topo", "-m").stdout.splitlines()
    real = capture_section(TEXT_L40S, "capabilities :: topo -m")
    assert ours[0] == real[0] and ours[2:] == real[2:]
    assert ours[1].split("\t")[:2] == real[1].split("\t")[:2]


def test_nvlink_status(smi, node):
    out = run(smi, node, "nvlink", "-s", "-i", "0").stdout.splitlines()
    real = capture_section(TEXT_H100, "capabilities :: nvlink -s")
    assert out[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    assert out[1:] == real[1:]
    for flag in ("-c", "-e"):
        r = run(smi, node, "nvlink", flag, "-i", "0")
        assert r.returncode == 0 and len(r.stdout.splitlines()) > 18


@pytest.mark.parametrize("node", [("l40s", 1)], indirect=True)
def test_nvlink_on_a_board_without(smi, node):
    ours = run(smi, node, "nvlink", "-s").stdout.splitlines()
    assert ours[1:] == capture_section(TEXT_L40S, "capabilities :: nvlink -s")[1:]


@pytest.mark.parametrize("node", [("h100", 1)], indirect=True)
def test_dmon_and_pmon_layout(smi, node):
    d = run(smi, node, "dmon", "-c", "2", "-d", "1").stdout.splitlines()
    real = capture_section(TEXT_H100, "idle :: dmon (per-device monitor, incl. PCIe rx/tx)")
    assert d[:2] == real[:2] and len(d) == 4
    assert [shape(l) for l in d[2:]] == [shape(real[2])] * 2 or [len(l) for l in d[2:]] == [len(real[2])] * 2
    p = run(smi, node, "pmon", "-c", "1").stdout.splitlines()
    assert p == capture_section(TEXT_H100, "idle :: pmon (per-process monitor)")[:3]


# --- a lost GPU, through a real mount -----------------------------------------------------------


def test_xid_79_reports_gpu_2_lost(smi, node_factory, expect_log):
    node = node_factory("h100", 4)
    env = consumer_env(node.state_dir / "state")
    bus = subprocess.run([str(smi), "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", "2"], env=env,
                         capture_output=True, text=True, timeout=10).stdout.strip()
    node.write("gpu2/inject_xid", b"79\n")
    msg = (f"Unable to determine the device handle for GPU{bus[4:]}: GPU is lost.  "
           "Reboot the system to recover this GPU\n")
    r = subprocess.run([str(smi)], env=env, capture_output=True, text=True, timeout=10)
    assert (r.returncode, r.stdout) == (15, msg)
    r = subprocess.run([str(smi), "-L"], env=env, capture_output=True, text=True, timeout=10)
    lines = r.stdout.splitlines()
    assert r.returncode == 15 and lines[2] == msg.rstrip("\n") and lines[3].startswith("GPU 3: ")
    r = subprocess.run([str(smi), "--query-gpu=index,name", "--format=csv,noheader"], env=env, capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 15 and r.stdout.splitlines()[2] == msg.rstrip("\n")
    r = subprocess.run([str(smi), "-i", "1"], env=env, capture_output=True, text=True, timeout=10)
    assert r.returncode == 0  # the other GPUs still answer
    node.write("gpu2/lost", b"0\n")
    r = subprocess.run([str(smi), "-L"], env=env, capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 4


def test_the_tree_serves_nvidia_smi(smi, mounted):
    tool = mounted.path("driver/usr/bin/nvidia-smi")
    r = subprocess.run([str(tool), "-L"], env=consumer_env(mounted.state_dir / "state"), capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 8
