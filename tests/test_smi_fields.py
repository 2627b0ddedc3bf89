"""nvidia-smi's field table (shims/nvidia-smi/fields.yaml) names only what is real. Each
-q label path and -q -x element path of a row is one that a real capture or a record of NVIDIA's
own nvidia-smi prints (a misspelt path would leave its value N/A without a word), each profile key
is a key of the GPU profile schema, and each row is shown somewhere. scripts/generate.py --check
(test_generated.py) holds the generated C and Python to the table."""
from __future__ import annotations

import importlib.util
import typing

import pytest
from pydantic import BaseModel

from helpers_smi import REPO
from mokkafs.model.schema import GpuProfile
from mokkafs.model.smi_fields import BY_PROFILE, FIELDS

pytestmark = pytest.mark.level("model")


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_smi", REPO / "shims" / "nvidia-smi" / "gen_smi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Seen(dict):
    """A path map that remembers every path it was asked for."""

    def __init__(self, base: dict) -> None:
        super().__init__(base)
        self.asked: set[str] = set()

    def get(self, key, default=None):
        self.asked.add(key)
        return super().get(key, default)


def test_every_path_is_printed_by_a_real_nvidia_smi(gen, monkeypatch):
    xml, text = _Seen(gen.XML_MAP), _Seen(gen.TEXT_MAP)
    monkeypatch.setattr(gen, "XML_MAP", xml)
    monkeypatch.setattr(gen, "TEXT_MAP", text)
    for board in gen.XML_BOARDS:
        gen.xml_skeleton(gen.CAPTURES / f"nvidia-smi-q-x.{board}.xml")
    for capture in (gen.TEXT_H100, gen.TEXT_L40S):
        gen.text_skeleton((gen.CAPTURES / capture).read_text())
    for branch in gen.BRANCHES:
        records = gen.RECORDS / str(branch)
        gen.xml_skeleton(records / "query.xml")
        for name in ("query.txt", "query-display.txt"):
            gen.text_skeleton((records / name).read_text(), record=True)
    assert sorted(x for f in FIELDS.values() for x in f.x if x not in xml.asked) == []
    assert sorted(q for f in FIELDS.values() for q in f.q if q not in text.asked) == []


def _schema_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys = set()
    for name, info in model.model_fields.items():
        keys.add(prefix + name)
        for t in (info.annotation, *typing.get_args(info.annotation)):
            if isinstance(t, type) and issubclass(t, BaseModel):
                keys |= _schema_keys(t, f"{prefix}{name}.")
    return keys


def test_every_profile_key_is_one_of_the_schema():
    assert sorted(set(BY_PROFILE) - _schema_keys(GpuProfile)) == []


def test_every_fact_is_shown_somewhere():
    assert [f.name for f in FIELDS.values() if not (f.query or f.q or f.x)] == []


def _na_leaf(text: str, label: str, value: str) -> str:
    """A record with its `label` block (the header and every deeper line) as one top-level leaf."""
    lines, out, skipping = text.splitlines(keepends=True), [], False
    col = next(l for l in lines if l.startswith("Timestamp")).index(": ")
    for line in lines:
        depth = len(line) - len(line.lstrip(" "))
        if skipping and depth > 4 and line.strip():
            continue
        skipping = line == f"    {label}\n"
        out.append(f"    {label}".ljust(col) + f": {value}\n" if skipping else line)
    return "".join(out)


@pytest.mark.parametrize("branch", [470, 525, 535, 550])
def test_a_supported_clocks_block_is_one_run_time_list(gen, branch):
    """A record's -q -d SUPPORTED_CLOCKS block (a Memory line per memory clock, a Graphics line per
    graphics clock under it: 81 to 220 lines on our NVML) is the one run-time list row our
    nvidia-smi fills from NVML, as a record's `Supported Clocks : N/A` was, not fixed lines; so is
    its <supported_clocks> element, and a Processes block."""
    records = gen.RECORDS / str(branch)
    text = (records / "query-display.txt").read_text()
    assert "\n    Supported Clocks\n        Memory " in text  # the record has a real list
    rows = gen.text_skeleton(text, record=True)
    assert [r for r in rows if r[1] == 3] == [(0, 3, "Supported Clocks", "supported_clocks", ""),
                                              (0, 3, "Processes", "processes", "")]
    assert rows == gen.text_skeleton(_na_leaf(text, "Supported Clocks", "N/A"), record=True)
    # a Processes block (a node with a process) is one list row too, what follows it kept
    procs = text.replace("    Processes                             : None\n",
                         "    Processes\n        GPU instance ID                   : N/A\n"
                         "        Process ID                        : 4242\n"
                         "            Type                          : C\n")
    assert procs != text and gen.text_skeleton(procs, record=True) == rows
    xml = gen.xml_skeleton(records / "query.xml")[1]
    assert [r for r in xml if "supported" in r[2] and "clock" in r[2]] == [(2, 3, "supported_clocks", "supported_clocks", "")]
