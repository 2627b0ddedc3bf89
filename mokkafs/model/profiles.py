"""Loading GPU profiles (`profiles/<name>.yaml`) and node compositions (`compositions/<name>.yaml`)
into the schemas of `mokkafs.model.schema`, with errors that name the file and the key; where the
shipped ones lie. The only module of the model that reads files.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from mokkafs.model.schema import Composition, GpuProfile, ProfileError

PROFILE_DIRS = [
    Path(__file__).resolve().parents[2] / "profiles",  # a source checkout or editable install
    Path(__file__).resolve().parents[1] / "profiles_data",  # a wheel (package-dir mapping)
]
COMPOSITION_DIRS = [
    Path(__file__).resolve().parents[2] / "compositions",
    Path(__file__).resolve().parents[1] / "compositions_data",
]


def profile_dirs() -> list[Path]:
    return [d for d in PROFILE_DIRS if d.is_dir()]


def available_profiles() -> list[str]:
    names: set[str] = set()
    for d in profile_dirs():
        names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def _format_validation_error(path: Path, err: ValidationError, schema: type[BaseModel] | None = None) -> str:
    schema = schema or GpuProfile
    return f"{path}: invalid {'profile' if schema is GpuProfile else 'composition'}: {validation_problem(err, schema)}"


def validation_problem(err: ValidationError, schema: type[BaseModel]) -> str:
    """pydantic's verdict as one line: the first problem's key (its location) and why, and the
    keys of any further problems (a terminal or a log shows one line per refusal)."""
    problems = []
    for e in err.errors(include_input=False, include_url=False):
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = " ".join(e["msg"].split())
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(schema, e["loc"][:-1])
            msg = f"unknown key; allowed keys here: {', '.join(allowed)}"
        problems.append((key, msg))
    key, msg = problems[0]
    if len(problems) == 1:
        return f"{key}: {msg}"
    others = ", ".join(k for k, _ in problems[1:4]) + (", ..." if len(problems) > 4 else "")
    return f"{key}: {msg} (and {len(problems) - 1} more: {others})"


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            break
        ann = field.annotation
        for cand in _models_in(ann):
            model = cand
            break
    return sorted(model.model_fields)


def _models_in(ann) -> list[type[BaseModel]]:
    """The pydantic models an annotation names, through unions and tuples."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    return [m for arg in getattr(ann, "__args__", ()) for m in _models_in(arg)]


# A profile or composition is a few KiB; anything past this is not one (a multi-GiB file, or
# /dev/zero, would otherwise be read whole).
MAX_INPUT_BYTES = 1 << 20


def read_input(path: Path, what: str, cap: int = MAX_INPUT_BYTES) -> str:
    """The text of `path`, a regular file of at most `cap` bytes of UTF-8, or ProfileError naming
    the file. Opened without blocking, so a FIFO is refused at once instead of hanging."""
    import os
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ProfileError(f"{path}: cannot read {what}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ProfileError(f"{path}: cannot read {what}: not a regular file")
        if st.st_size > cap:
            raise ProfileError(f"{path}: cannot read {what}: {st.st_size} bytes, more than the {cap} allowed")
        data = b""
        while len(data) <= cap:
            chunk = os.read(fd, cap + 1 - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) > cap:
            raise ProfileError(f"{path}: cannot read {what}: more than the {cap} bytes allowed")
    except OSError as e:
        raise ProfileError(f"{path}: cannot read {what}: {e.strerror}") from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ProfileError(f"{path}: line {line}: not UTF-8 text") from None


# No key of a profile, composition or scenario holds a number near this long; Python refuses to
# convert decimal text past 4,300 digits at all, which PyYAML would raise as a bare ValueError.
MAX_NUMBER_CHARS = 32


# libyaml's parser (PyYAML's C binding, with the same safe constructor) where PyYAML was built
# with it: a profile loads in ~3 ms where the pure-Python parser takes ~25-40 ms of every start.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def too_deep(e: BaseException) -> bool:
    """Nesting past what the parser takes: Python's recursion limit for PyYAML's own parser,
    libyaml's depth limit (1,000) for the C one."""
    return isinstance(e, RecursionError) or (
        isinstance(e, yaml.YAMLError) and "maximum nesting depth" in str(getattr(e, "problem", "")))


class StrictLoader(_SAFE_LOADER):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last
    silently, so a typo'd duplicate would override what the reader sees first) and a number
    longer than MAX_NUMBER_CHARS, each as a YAML error at its line."""

    def construct_yaml_int(self, node):
        if len(node.value) > MAX_NUMBER_CHARS:
            raise yaml.constructor.ConstructorError(
                None, None, f"a number of {len(node.value)} characters, more than the {MAX_NUMBER_CHARS} any key takes",
                node.start_mark)
        return super().construct_yaml_int(node)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:
                continue  # an unhashable key: construct_mapping's own error says so
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)


def _read_mapping(path: Path, what: str) -> dict:
    text = read_input(path, what)
    try:
        raw = yaml.load(text, Loader=StrictLoader)
    except (yaml.YAMLError, RecursionError) as e:
        if too_deep(e):
            raise ProfileError(f"{path}: nested too deeply") from None
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ProfileError(f"{path}: not valid YAML{where}: {' '.join(str(problem).split())}") from None
    except ValueError as e:  # a scalar PyYAML resolves but cannot make (a 2026-13-45 date)
        raise ProfileError(f"{path}: not valid YAML: {' '.join(str(e).split())[:200]}") from None
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: a {what} must be a mapping of keys, got {type(raw).__name__}")
    return raw


def load_profile_file(path: Path) -> GpuProfile:
    raw = _read_mapping(path, "profile")
    try:
        return GpuProfile.model_validate(raw)
    except ValidationError as e:
        raise ProfileError(_format_validation_error(path, e)) from None


def load_profile(name_or_path: str) -> GpuProfile:
    """A shipped profile by name (`h100`) or a YAML file by path."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        return load_profile_file(candidate)
    for d in profile_dirs():
        path = d / f"{name_or_path}.yaml"
        if path.is_file():
            return load_profile_file(path)
    raise ProfileError(
        f"unknown profile {name_or_path!r}; shipped profiles: {', '.join(available_profiles())}"
    )


# --- node compositions ---------------------------------------------------------------------------


def composition_dirs() -> list[Path]:
    return [d for d in COMPOSITION_DIRS if d.is_dir()]


def available_compositions() -> list[str]:
    names: set[str] = set()
    for d in composition_dirs():
        names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def load_composition_file(path: Path) -> Composition:
    try:
        st = path.stat()
    except OSError as e:
        raise ProfileError(f"{path}: cannot read composition: {e.strerror}") from None
    return _load_composition_file(path, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=64)
def _load_composition_file(path: Path, mtime_ns: int, size: int) -> Composition:
    raw = _read_mapping(path, "composition")
    try:
        return Composition.model_validate(raw)
    except ValidationError as e:
        raise ProfileError(_format_validation_error(path, e, Composition)) from None


def load_composition(name_or_path: str, shipped_only: bool = False) -> Composition:
    """A shipped composition by name (`hgx-8`) or, unless `shipped_only`, a YAML file by path."""
    candidate = Path(name_or_path)
    if not shipped_only and (candidate.suffix in (".yaml", ".yml") or "/" in name_or_path):
        return load_composition_file(candidate)
    if re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", name_or_path):
        for d in composition_dirs():
            path = d / f"{name_or_path}.yaml"
            if path.is_file():
                return load_composition_file(path)
    raise ProfileError(
        f"unknown composition {name_or_path!r}; shipped compositions: {', '.join(available_compositions())}"
    )
