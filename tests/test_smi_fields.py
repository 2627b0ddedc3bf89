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
