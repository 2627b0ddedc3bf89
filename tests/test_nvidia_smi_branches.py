"""Real tools against a published state: our nvidia-smi configured at a driver branch prints that
branch's layout. For each branch Debian ships (470, 525, 535, 550), NVIDIA's own binary of that
branch (scripts/fetch_nvidia_smi.sh) and ours run on the same published state, and their -q
skeleton (-d included), default-table frame, -q -x element tree, --query-gpu headers and refusals,
answers to unknown arguments and help texts are identical. The layouts are generated
(shims/nvidia-smi/gen_smi.py) from records of those binaries (tests/fixtures/nvidia-smi-branches,
shims/nvidia-smi/record_branches.py); values are compared field by field in
test_real_nvidia_smi.py."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from helpers_nvml import Published, consumer_env, nvml_path
from helpers_smi import REPO, smi_binary
from mokkafs.model.events import InjectEcc, SetProcesses

pytestmark = pytest.mark.level("tools")

CACHE = Path(os.environ.get("MOKKA_NVIDIA_SMI_CACHE", REPO / ".cache" / "nvidia-smi"))
RECORDS = REPO / "tests" / "fixtures" / "nvidia-smi-branches"
# One board per branch that branch drives (470 predates Hopper), plus an A100 at 535: its
# thresholds are absolute where the H100's are relative to T.Limit, in the same rows.
COMBOS = [(470, "a100"), (525, "h100"), (535, "h100"), (535, "a100"), (550, "h100"), (550, "l40s")]


def real_binary(branch: int) -> Path:
    binary = CACHE / str(branch) / "nvidia-smi"
    if not binary.is_file():
        pytest.skip(f"NVIDIA's nvidia-smi {branch} is not fetched: run scripts/fetch_nvidia_smi.sh")
    return binary


class Pair:
    """NVIDIA's nvidia-smi of one branch and ours, on one published node at that branch's driver."""

    def __init__(self, node: Published, branch: int, ours: Path, pid: int) -> None:
        self.node, self.branch, self.ours_binary, self.pid = node, branch, ours, pid
        self.real_binary = real_binary(branch)

    def _run(self, binary: Path, args: tuple[str, ...]) -> subprocess.CompletedProcess:
        return subprocess.run([str(binary), *args], env=consumer_env(self.node.path), capture_output=True,
                              text=True, timeout=60)

    def real(self, *args: str) -> subprocess.CompletedProcess:
        return self._run(self.real_binary, args)

    def ours(self, *args: str) -> subprocess.CompletedProcess:
        return self._run(self.ours_binary, args)

    def both(self, *args: str) -> tuple[str, str]:
        real, ours = self.real(*args), self.ours(*args)
        assert real.returncode == 0, (args, real.stdout[-500:], real.stderr[-500:])
        assert ours.returncode == 0, (args, ours.stdout[-500:], ours.stderr[-500:])
        return real.stdout, ours.stdout


@pytest.fixture(scope="module")
def ours(tmp_path_factory) -> Path:
    nvml_path()
    return smi_binary(tmp_path_factory)


@pytest.fixture(scope="module", params=COMBOS, ids=[f"{b}-{p}" for b, p in COMBOS])
def pair(request, ours, tmp_path_factory):
    branch, profile = request.param
    real_binary(branch)
    version = (CACHE / str(branch) / "version").read_text().split()[1].split("-")[0]
    node = Published(tmp_path_factory.mktemp(f"b{branch}"), profile, 2, version)
    sleeper = subprocess.Popen(["sleep", "600"])  # one process on GPU 0, in every mode's output
    try:
        node.apply(SetProcesses(0, ((sleeper.pid, 300 << 20),)))
        yield Pair(node, branch, ours, sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
        node.close()


def skeleton(text: str) -> list[str]:
    """-q without its values: each line up to and including its colon (labels, nesting and the
    colon column), section headers whole."""
    return [re.sub(r":.*", ":", line) if " : " in line or line.endswith(" :") else line
            for line in text.splitlines()]


def frame(text: str) -> list[tuple]:
    """The default table without its values: per line its length and where its | and + are; lines
    with no digit (rules, column headers, the line between the tables) whole."""
    out = []
    for i, line in enumerate(text.splitlines()):
        if i == 0:  # the timestamp, and the spaces after it
            out.append(("timestamp", len(line) - len(line.rstrip(" "))))
        elif re.search(r"\d", line):
            out.append((len(line), [m.start() for m in re.finditer(r"[|+]", line)]))
        else:
            out.append(line)
    return out


def test_query_text_skeleton(pair):
    real, ours = pair.both("-q")
    assert skeleton(ours) == skeleton(real)
    assert f": {pair.pid}\n" in real
    colon = {470: 42, 525: 42, 535: 42, 550: 42}[pair.branch]
    assert re.search(rf"^Driver Version {{{colon - 14}}}: ", ours, re.M)


def test_default_table_frame(pair):
    """The frame, with one process row on GPU 0: 79 columns up to 525, 89 in 535 (its own column
    headers), 91 from 550; the line between the two tables is spaces as wide as the frame."""
    real, ours = pair.both()
    assert f" {pair.pid} " in real and f" {pair.pid} " in ours
    assert frame(ours) == frame(real), "\n" + real + "\n" + ours
    width = {470: 79, 525: 79, 535: 89, 550: 91}[pair.branch]
    assert len(real.splitlines()[1]) == width


def tree(e: ET.Element, depth: int = 0) -> list[str]:
    """Every element under e, in document order, repeats included, indented by depth."""
    return [line for c in e for line in ["  " * depth + c.tag, *tree(c, depth + 1)]]


def test_xml_element_tree_and_header(pair):
    real, ours = pair.both("-q", "-x")
    assert ours.splitlines()[:2] == real.splitlines()[:2]  # the declaration and the branch's DTD
    r, o = ET.fromstring(real), ET.fromstring(ours)
    assert [c.tag for c in o] == [c.tag for c in r]
    assert tree(o) == tree(r)


def display_sections(help_text: str) -> list[str]:
    """The -d sections the branch's -h lists."""
    block = help_text.split("--display=", 1)[1].split("Flags can be combined", 1)[0]
    return re.findall(r"[A-Z][A-Z_]+", block)


def test_display_sections(pair):
    """-q -d SECTION for every section the branch's help lists; with -x, refused as these
    branches refuse it."""
    sections = display_sections(pair.real("-h").stdout)
    assert "MEMORY" in sections and len(sections) >= 17
    for section in sections:
        real, ours = pair.both("-q", "-d", section)
        assert skeleton(ours) == skeleton(real), section
    real, ours = pair.real("-q", "-x", "-d", "MEMORY"), pair.ours("-q", "-x", "-d", "MEMORY")
    assert (ours.returncode, ours.stdout) == (real.returncode, real.stdout) and real.returncode == 2


def _fields(help_text: str) -> tuple[list[str], list[str]]:
    names, aliases = [], []
    for line in help_text.splitlines():
        m = re.fullmatch(r'"([a-z][^"]*)"(?: or "([^"]+)")?', line)
        if m:
            names.append(m.group(1))
            aliases += [m.group(2)] if m.group(2) else []
    return names, aliases


def test_query_gpu_headers(pair):
    """Every field the branch knows, by its first name and by its alias: the CSV header names each
    by its first name (asked `clocks.sm`, the tool prints `clocks.current.sm`), with its unit."""
    names, aliases = _fields(pair.real("--help-query-gpu").stdout)
    assert len(names) > 100
    for fields in (names, aliases):
        for fmt in ("csv", "csv,nounits"):
            real, ours = pair.both(f"--query-gpu={','.join(fields)}", f"--format={fmt}")
            assert ours.splitlines()[0] == real.splitlines()[0]
            assert len(ours.splitlines()) == len(real.splitlines()) == 3


def test_apps_headers(pair):
    """--query-compute-apps and --query-accounted-apps name their fields by the first name too."""
    for option, fields in (("--query-compute-apps", "pid,name,used_memory,gpu_uuid,process_name"),
                           ("--query-accounted-apps",
                            "timestamp,vgpu_instance,gpu_util,mem_util,pid,max_memory_usage,time,gpu_uuid"),
                           ("--query-retired-pages", "retired_pages.cause,gpu_name,retired_pages.address")):
        real, ours = pair.both(f"{option}={fields}", "--format=csv")
        assert ours.splitlines()[0] == real.splitlines()[0], option


@pytest.mark.parametrize("branch", [470, 525, 535, 550])
def test_retired_pages_list(branch, ours, tmp_path):
    """--query-retired-pages as the branch's binary prints it: on a T4 (page retirement) one row
    per retired page (a double-bit error retired one on GPU 1), none for a cause without pages;
    on a board that remaps rows one [N/A] row per cause; every format."""
    real = real_binary(branch)
    version = (CACHE / str(branch) / "version").read_text().split()[1].split("-")[0]
    fields = ("timestamp,gpu_name,gpu_bus_id,gpu_serial,gpu_uuid,retired_pages.address,retired_pages.timestamp,"
              "retired_pages.cause")
    for profile in ("t4", "h100") if branch >= 525 else ("t4",):
        node = Published(tmp_path / profile, profile, 2, version)
        try:
            if profile == "t4":
                node.apply(InjectEcc(1, "dbe", 1))
            for fmt in ("csv", "csv,noheader,nounits"):
                args = (f"--query-retired-pages={fields}", f"--format={fmt}")
                got = [subprocess.run([str(b), *args], env=consumer_env(node.path), capture_output=True, text=True,
                                      timeout=60) for b in (real, ours)]
                assert got[1].returncode == got[0].returncode == 0
                cut = lambda out: [l.split(", ", 1)[-1] for l in out.splitlines()]  # noqa: E731 (the timestamp)
                assert cut(got[1].stdout) == cut(got[0].stdout), (profile, fmt)
                rows = [l for l in got[1].stdout.splitlines() if l.endswith("ECC")]
                assert len(rows) == (1 if profile == "t4" else 4), got[1].stdout
        finally:
            node.close()


def test_missing_or_bad_format(pair):
    """A query without --format, with one that is not csv or names an unknown modifier: the
    branch's message and exit code, the fields checked between the two."""
    for args in (("--query-gpu=name",), ("--query-compute-apps=pid",), ("--query-retired-pages=gpu_name",),
                 ("--query-gpu=name", "--format=tsv"), ("--query-gpu=name", "--format=csv,bogus"),
                 ("--query-gpu=name", "--format=noheader"), ("--query-gpu=bogus", "--format=tsv"),
                 ("--query-gpu=bogus",)):
        real, ours = pair.real(*args), pair.ours(*args)
        assert (ours.stdout, ours.returncode) == (real.stdout, real.returncode), args
        assert real.returncode == 2


def test_addressing_mode_is_none_before_570(pair):
    """Every real -q of 535-565 prints Addressing Mode None (boards whose 570+ captures say HMM
    included): NVIDIA's binary (export entry 242) and ours print it from the model's answer.
    Before 535 neither prints the line at all."""
    real, ours = pair.both("-q")
    lines = lambda out: [l for l in out.splitlines() if l.startswith("    Addressing Mode ")]  # noqa: E731
    if pair.branch < 535:
        assert lines(real) == lines(ours) == []
    else:
        assert lines(real) == lines(ours) and lines(ours) and all(l.endswith(": None") for l in lines(ours))


def test_query_gpu_refuses_what_the_branch_does_not_know(pair):
    """The fields of later branches (our 590 list) that this branch lacks are refused with the
    real message and exit code, one at a time as the tool stops at the first (a name longer than
    63 characters is cut there in the message)."""
    branch_names = set(sum(_fields(pair.real("--help-query-gpu").stdout), []))
    # the fields of the newest branch, which our nvidia-smi prints at 570 and later
    latest = Published(pair.node.path.parent / "latest", "h100", 1)
    try:
        r = subprocess.run([str(pair.ours_binary), "--help-query-gpu"], env=consumer_env(latest.path),
                           capture_output=True, text=True, timeout=30)
    finally:
        latest.close()
    later = [f for f in sum(_fields(r.stdout), []) if f not in branch_names]
    assert "remapped_rows.pending" in later or pair.branch >= 550
    assert len(later) > 10
    for field in later:
        args = (f"--query-gpu={field}", "--format=csv")
        real, ours = pair.real(*args), pair.ours(*args)
        assert (ours.returncode, ours.stdout) == (real.returncode, real.stdout), field
        assert real.returncode == 2 and f'Field "{field[:63]}" is not a valid field to query.' in real.stdout


def test_help_texts(pair):
    for option in ("-h", "--help-query-gpu", "--help-query-compute-apps", "--help-query-accounted-apps",
                   "--help-query-retired-pages", "--help-query-remapped-rows"):
        real, ours = pair.both(option)
        assert ours == real, option


def test_unknown_arguments(pair):
    """What the branch prints for an argument it does not know, and its exit code: --version
    before 550, an unknown option, a word."""
    for args in (("--version",), ("--bogus",), ("-q", "--bogus"), ("foo",), ("-x",)):
        real, ours = pair.real(*args), pair.ours(*args)
        assert (ours.stdout, ours.returncode) == (real.stdout, real.returncode), args
    assert (pair.real("--version").returncode == 0) == (pair.branch >= 550)


def test_records_are_what_the_generator_read():
    """smi_gen.h is generated from the records and the captures (gen_smi.py --check)."""
    r = subprocess.run([sys.executable, str(REPO / "shims" / "nvidia-smi" / "gen_smi.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in RECORDS.iterdir()) == ["470", "525", "535", "550"]


def test_branch_follows_the_configured_driver_between_records(ours, tmp_path):
    """A driver between two recorded branches takes the older one's layout (545 -> 535's); from
    570 the captures' (the 590 colon column, 55)."""
    for version, colon, width in (("545.23.08", 42, 89), ("570.148.08", 55, 91), ("460.91.03", 42, 79)):
        node = Published(tmp_path / version, "a100", 1, version)
        try:
            env = consumer_env(node.path)
            q = subprocess.run([str(ours), "-q"], env=env, capture_output=True, text=True, timeout=30).stdout
            table = subprocess.run([str(ours)], env=env, capture_output=True, text=True, timeout=30).stdout
            help_text = subprocess.run([str(ours), "-h"], env=env, capture_output=True, text=True, timeout=30).stdout
        finally:
            node.close()
        assert re.search(rf"^Driver Version {{{colon - 14}}}: {re.escape(version)}$", q, re.M), (version, q[:300])
        assert len(table.splitlines()[1]) == width, version
        assert help_text.startswith(f"NVIDIA System Management Interface -- v{version}\n")
