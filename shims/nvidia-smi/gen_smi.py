#!/usr/bin/env python3
"""Generates nvidia-smi's tables from real output and from fields.yaml: smi_gen.h (the key of every
fact, the structs) and smi_gen.c (its data) from the 590/595 captures (help texts, the --query-gpu
field table with names, aliases and units, per captured board the -q -x element skeleton, the -q
text skeletons of 590 and 595) and the records of NVIDIA's own nvidia-smi of each Debian-shipped
branch (tests/fixtures/nvidia-smi-branches, made by record_branches.py): per branch its help
texts, --query-gpu fields with their units and printed names, -q and -q -x skeletons, -q colon
column, DTD version and default-table frame; and smi_values_gen.c, the value dispatch, from
fields.yaml, which also names the fact behind each field, label and element. The smi_*.c files
fill the skeletons with values from NVML. `--check` fails if an output is stale (CI runs it)."""
from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CAPTURES = ROOT / "tests" / "fixtures" / "captures"
OUT = HERE / "smi_gen.h"
PY_OUT = ROOT / "mokkafs" / "model" / "smi_fields.py"
TEXT_H100 = "nvidia-smi-text.h100-80gb-hbm3.590.48.01.txt"
TEXT_L40S = "nvidia-smi-text.l40s.595.80.txt"
XML_BOARDS = ["a100", "h100", "b200", "gb200", "gb300", "l40s", "t4"]
RECORDS = ROOT / "tests" / "fixtures" / "nvidia-smi-branches"
BRANCHES = [470, 525, 535, 550]  # the Debian-shipped branches recorded by record_branches.py
# Branches between the records and the 590 capture with a real -q text capture: each takes the
# newest record below it for everything but its -q (the capture's skeleton) and -q -d (the
# record's sections and sample blocks in the record's order, each section's rows the capture's).
BETWEEN = {555: "nvidia-smi-q.a100-80gb.555.42.02.txt", 565: "nvidia-smi-q.h100.565.57.01.txt"}

FIELDS_FILE = HERE / "fields.yaml"
FIELD_COLUMNS = {"also", "unit", "get", "deprecated_from", "na_before", "na_from", "na_in_mig", "na_plain", "unit_joined", "q", "x",
                 "suffix", "profile"}


def _paths(v) -> list[str]:
    return v if isinstance(v, list) else [v] if v else []


def load_fields() -> dict[str, dict]:
    """fields.yaml: each fact once (see its header), checked for what a typo would break."""
    facts = yaml.safe_load(FIELDS_FILE.read_text())
    for name, row in facts.items():
        unknown = set(row) - FIELD_COLUMNS
        if unknown:
            raise SystemExit(f"{FIELDS_FILE.name}: {name}: unknown column(s) {sorted(unknown)}")
        q, x = _paths(row.get("q")), _paths(row.get("x"))
        if len(q) > 1 and len(x) > 1 and len(q) != len(x):
            raise SystemExit(f"{FIELDS_FILE.name}: {name}: q and x list several spellings but not in parallel")
        get = row.get("get")
        if get is not None and not re.fullmatch(r"[A-Za-z_]\w*\((.*)\)", get):
            raise SystemExit(f"{FIELDS_FILE.name}: {name}: get {get!r} is not SHAPE(ARGS)")
    return facts


FACTS = load_fields()
# The facts --query-gpu shows, by every name it accepts for them (590's; aliases come with them).
QUERY_FACT = {q: name for name, row in FACTS.items()
              for q in ([] if name.startswith("x.") else [name]) + _paths(row.get("also"))}
# -q -x leaf path / -q text label path -> (fact, suffix appended to a value that is available)
XML_MAP: dict[str, tuple[str, str]] = {}
TEXT_MAP: dict[str, tuple[str, str]] = {}
for _name, _row in FACTS.items():
    for _col, _map in (("x", XML_MAP), ("q", TEXT_MAP)):
        for _p in _paths(_row.get(_col)):
            if _p in _map:
                raise SystemExit(f"{FIELDS_FILE.name}: {_col} {_p!r} is both {_map[_p][0]} and {_name}")
            _map[_p] = (_name, _row.get("suffix", ""))


# Leaves whose structure is rebuilt at run time (lists): their subtree is not copied.
DYNAMIC = {"processes": "processes", "accounted_processes": "accounted_processes", "mig_devices": "mig_devices",
           "supported_clocks": "supported_clocks"}


def section(text: str, title: str) -> str:
    """The body of one `# <title>` section of an nvidia_gpu_exporter capture."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line == f"# {title}":
            j = i + 1
            while not lines[j].startswith("####"):
                j += 1
            body = []
            for k in range(j + 1, len(lines)):
                if lines[k].startswith("################"):
                    break
                body.append(lines[k])
            while body and body[-1] == "":
                body.pop()
            return "\n".join(body) + "\n"
    raise SystemExit(f"section {title!r} not in capture")


def c_str(s: str) -> str:
    out = []
    for line in s.splitlines(keepends=True):
        esc = line.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        out.append(f'    "{esc}"')
    return "\n".join(out) if out else '    ""'


def ident(name: str) -> str:
    return "K_" + re.sub(r"[^A-Za-z0-9]", "_", name)


def query_fields(text: str) -> list[tuple[str, str, str]]:
    """(name, alias, unit) in --help-query-gpu order; units from the captured CSV header."""
    help_text = section(text, "capabilities :: help-query-gpu")
    fields = []
    for line in help_text.splitlines():
        m = re.fullmatch(r'"([^"]+)"(?: or "([^"]+)")?', line.strip())
        if m:
            fields.append((m.group(1), m.group(2) or ""))
    header = section(text, "idle :: query-gpu (csv, what the exporter parses)").splitlines()[0]
    units = {}
    for col in header.split(", "):
        m = re.fullmatch(r"(\S+) \[([^\]]+)\]", col)
        if m:
            units[m.group(1)] = m.group(2)
    return [(n, a, units.get(n, "")) for n, a in fields]


def xml_skeleton(path: Path) -> tuple[str, list[tuple[int, int, str, str, str]]]:
    """(product name, rows) for the first GPU of a capture. A row: (depth, kind, tag, key, suffix);
    kind 0 opens an element, 1 is a leaf, 2 closes, 3 is a run-time list."""
    gpu = ET.parse(path).getroot().find("gpu")
    rows: list[tuple[int, int, str, str, str]] = []

    def walk(e: ET.Element, prefix: str, depth: int) -> None:
        seen_children: set[str] = set()
        for c in e:
            p = f"{prefix}{c.tag}"
            if c.tag in seen_children:  # repeated list entries: keep one
                continue
            seen_children.add(c.tag)
            if p in DYNAMIC:
                rows.append((depth, 3, c.tag, DYNAMIC[p], ""))
            elif len(c):
                rows.append((depth, 0, c.tag, "", ""))
                walk(c, p + "/", depth + 1)
                rows.append((depth, 2, c.tag, "", ""))
            else:
                m = XML_MAP.get(p, "")
                key, suffix = m if isinstance(m, tuple) else (m, "")
                rows.append((depth, 1, c.tag, key, suffix))

    walk(gpu, "", 2)
    return gpu.findtext("product_name"), rows


def colon_column(body: list[str]) -> int:
    """Where -q puts its colons: the column of the Timestamp line's (42 before 570, 55 after)."""
    line = next(l for l in body if l.startswith("Timestamp") and ": " in l)
    return line.index(": ")


# -q labels whose body is a list our nvidia-smi builds from NVML at run time (smi_query.c): one
# row of kind 3 stands for the whole block, whether the record shows it as an N/A or None leaf
# (a board or node without one) or as a header over its entries (Supported Clocks: a Memory line
# per nvmlDeviceGetSupportedMemoryClocks entry, a Graphics line under it per
# nvmlDeviceGetSupportedGraphicsClocks entry; Processes: one block per process).
TEXT_LISTS = {"Processes": "processes", "Supported Clocks": "supported_clocks"}


def text_skeleton(text: str, record: bool = False) -> list[tuple[int, int, str, str, str]]:
    """Rows of the first GPU of the idle -q section of a capture, or of a whole record: (depth,
    kind 0 header / 1 leaf / 3 run-time list, label, key, suffix)."""
    body = (text if record else section(text, "idle :: query (-q)")).splitlines()
    col = colon_column(body)
    start = next(i for i, l in enumerate(body) if l.startswith("GPU ")) + 1
    rows = []
    stack: list[str] = []
    in_list = -1  # the depth of the run-time list whose entries are being skipped
    for line in body[start:]:
        if not line.strip():
            break
        depth = (len(line) - len(line.lstrip(" "))) // 4 - 1
        if in_list >= 0 and depth > in_list:
            continue
        in_list = -1
        leaf = len(line) > col and line[col] == ":"
        label = (line[:col] if leaf else line).strip()
        del stack[depth:]
        path = "/".join(stack + [label])
        if path in TEXT_LISTS:
            rows.append((depth, 3, label, TEXT_LISTS[path], ""))
            in_list = depth
            continue
        if leaf:
            m = TEXT_MAP.get(path, "")
            key, suffix = m if isinstance(m, tuple) else (m, "")
            rows.append((depth, 1, label, key, suffix))
            stack.append(label)
        else:
            # a header keeps its trailing space ("GPU Memory Power Readings "), as the driver prints it
            rows.append((depth, 0, line.lstrip(" "), "", ""))
            stack.append(label)
    return rows


def help_body(text: str) -> str:
    """A help text without its first line, "NVIDIA System Management Interface -- v<version>",
    which the tool prints with the driver's version."""
    first, rest = text.split("\n", 1)
    if not re.fullmatch(r"NVIDIA System Management Interface -- v[\d.]+", first):
        raise SystemExit(f"unexpected first help line {first!r}")
    return rest


def record_fields(branch: int, fields590: list[tuple[str, str, str]]) -> list[tuple[str, str, str, str]]:
    """(name, alias, unit, fact) of a branch's --query-gpu fields, in its --help-query-gpu order.
    The unit is the one its CSV header printed; the fact is the one of the 590 field of the same
    name or alias (\"\" when fields.yaml has none: the tool knows it, we print [N/A])."""
    d = RECORDS / str(branch)
    fields = []
    for line in (d / "help-query-gpu.txt").read_text().splitlines():
        m = re.fullmatch(r'"([a-z][^"]*)"(?: or "([^"]+)")?', line)
        if m:
            fields.append((m.group(1), m.group(2) or ""))
    csv = (d / "query-gpu.csv").read_text().splitlines()
    by_name, by_alias = csv[0].split(", "), csv[2].split(", ")
    aliased = [f for f in fields if f[1]]
    if len(by_name) != len(fields) or len(by_alias) != len(aliased):
        raise SystemExit(f"{d}: the CSV headers do not match --help-query-gpu")
    units = {}
    for (name, _), col in zip(fields, by_name):
        m = re.fullmatch(r"(\S+)(?: \[([^\]]+)\])?", col)
        if not m or m.group(1) != name:
            raise SystemExit(f"{d}: {name} printed as {col!r}")
        units[name] = m.group(2) or ""
    for (name, alias), col in zip(aliased, by_alias):  # an alias prints its field's first name
        if col.split(" [")[0] != name:
            raise SystemExit(f"{d}: alias {alias} printed as {col!r}, not {name}")
    keys = {}
    for n, a, _ in fields590:
        keys.setdefault(n, n)
        if a:
            keys.setdefault(a, n)
    return [(n, a, units[n], QUERY_FACT.get(keys.get(n) or keys.get(a, ""), "")) for n, a in fields]


def table_frame(text: str) -> dict:
    """The frame of a recorded default table (one GPU, no processes): its rules, headers, the line
    between the two tables and the widths of the version line's three values."""
    lines = text.splitlines()
    m = re.fullmatch(r"\| NVIDIA-SMI (\S+ +)Driver Version: (\S+ +)CUDA Version: (\S+ +)\|", lines[2])
    if not m:
        raise SystemExit(f"unexpected version line {lines[2]!r}")
    k = next(i for i, l in enumerate(lines) if l.startswith("|==="))
    ts = lines[0]
    return {"width": len(lines[1]), "ts_pad": len(ts) - len(ts.rstrip(" ")),
            "w_smi": len(m.group(1)), "w_drv": len(m.group(2)), "w_cuda": len(m.group(3)),
            "rule": lines[1] + "\n", "grid": lines[3] + "\n", "head": "\n".join(lines[4:k + 1]) + "\n",
            "row_rule": lines[k + 4] + "\n", "gap": lines[k + 5] + "\n",
            "procs_head": "\n".join(lines[k + 7:k + 11]) + "\n", "no_procs": lines[k + 11] + "\n"}


def branch_parts(fields590, keys: dict[str, int]) -> list[str]:
    parts = []
    for b in BRANCHES:
        d = RECORDS / str(b)
        for var, name in [("HELP_TEXT", "help.txt"), ("HELP_QUERY_GPU", "help-query-gpu.txt"),
                          ("HELP_QUERY_COMPUTE_APPS", "help-query-compute-apps.txt"),
                          ("HELP_QUERY_ACCOUNTED_APPS", "help-query-accounted-apps.txt"),
                          ("HELP_QUERY_RETIRED_PAGES", "help-query-retired-pages.txt"),
                          ("HELP_QUERY_REMAPPED_ROWS", "help-query-remapped-rows.txt")]:
            text = (d / name).read_text()
            parts.append(f"static const char {var}_{b}[] =\n{c_str(help_body(text) if var == 'HELP_TEXT' else text)};\n")
        parts.append(f"static const struct qfield QUERY_GPU_FIELDS_{b}[] = {{")
        parts += [f'    {{"{n}", "{a}", "{u}", {ident(k) if k else "K_NONE"}}},' for n, a, u, k in record_fields(b, fields590)]
        parts.append("    {0, 0, 0, K_NONE},\n};\n")
        parts.append(rows_c(f"TEXT_{b}", text_skeleton((d / "query.txt").read_text(), record=True), keys))
        # -q -d: the same sections, with the sample blocks only -d prints
        parts.append(rows_c(f"TEXT_D_{b}", text_skeleton((d / "query-display.txt").read_text(), record=True), keys))
        parts.append(rows_c(f"XML_{b}", xml_skeleton(d / "query.xml")[1], keys))
    for b, capture in BETWEEN.items():
        rec = max(r for r in BRANCHES if r < b)
        text = text_skeleton((CAPTURES / capture).read_text(), record=True)
        display = text_skeleton((RECORDS / str(rec) / "query-display.txt").read_text(), record=True)
        parts.append(rows_c(f"TEXT_{b}", text, keys))
        parts.append(rows_c(f"TEXT_D_{b}", display_skeleton(display, text), keys))
    parts.append("const struct branch BRANCHES[] = {")
    for b in sorted(BRANCHES + list(BETWEEN)):
        rec = max(r for r in BRANCHES if r <= b)  # the record of everything a capture does not show
        d = RECORDS / str(rec)
        query = (CAPTURES / BETWEEN[b] if b in BETWEEN else d / "query.txt").read_text().splitlines()
        dtd = re.search(r"nvsmi_device_v(\d+)\.dtd", (d / "query.xml").read_text()).group(1)
        f = table_frame((d / "table.txt").read_text())
        frame = ", ".join(str(f[k]) for k in ("width", "ts_pad", "w_smi", "w_drv", "w_cuda"))
        frame += "".join(f",\n     {c_str(f[k]).strip()}"
                         for k in ("rule", "grid", "head", "row_rule", "gap", "procs_head", "no_procs"))
        *unknown, rc = (d / "unknown-option.txt").read_text().split("\n")[:-1]  # an argument it does not know
        unknown = "\n".join(unknown) + "\n"
        if "--no-such-option" in unknown:
            unknown = unknown.replace("--no-such-option", "%s")
        r = rec
        parts.append(f"    {{{b}, {colon_column(query)}, {dtd}, {int(rc)}, {c_str(unknown).strip()},\n"
                     f"     HELP_TEXT_{r}, HELP_QUERY_GPU_{r}, HELP_QUERY_COMPUTE_APPS_{r}, HELP_QUERY_ACCOUNTED_APPS_{r},\n"
                     f"     HELP_QUERY_RETIRED_PAGES_{r}, HELP_QUERY_REMAPPED_ROWS_{r},\n     QUERY_GPU_FIELDS_{r}, TEXT_{b}, TEXT_D_{b}, XML_{r},\n     {{{frame}}}}},")
    parts.append("    {0},\n};\n")
    return parts


def display_skeleton(record_display: list, text: list) -> list:
    """-q -d of a branch known by its -q text alone: the record's -d rows (its sections in its order,
    the blocks only -d prints), each top-level section the text also has replaced by the text's
    rows of it."""
    def blocks(rows):
        out: list[list] = []
        for row in rows:
            if row[0] == 0 or not out:
                out.append([])
            out[-1].append(row)
        return out

    own = {b[0][2].rstrip(): b for b in blocks(text)}
    return [row for b in blocks(record_display) for row in own.get(b[0][2].rstrip(), b)]


def rows_c(name: str, rows, keys: dict[str, int], exported: bool = False) -> str:
    out = [f"{'' if exported else 'static '}const struct skel {name}[] = {{"]
    for depth, kind, tag, key, suffix in rows:
        k = ident(key) if key else "K_NONE"
        if key and key not in keys:
            raise SystemExit(f"{name}: unknown key {key!r}")
        out.append(f'    {{{depth}, {kind}, {k}, "{tag}", "{suffix}"}},')
    out.append("    {0, 9, K_NONE, 0, 0},\n};")
    return "\n".join(out)


def check_fields(fields: list[tuple[str, str, str]]) -> None:
    """Every --query-gpu name of fields.yaml is one a captured tool (590 or 595) accepts, with the
    unit it prints."""
    units = {n: u for n, _, u in fields}
    for q, fact in QUERY_FACT.items():
        if q not in units:
            raise SystemExit(f"{FIELDS_FILE.name}: {q} is not a --query-gpu field of the 590 or 595 capture")
        if units[q] != FACTS[fact].get("unit", ""):
            raise SystemExit(f"{FIELDS_FILE.name}: {fact}: unit {FACTS[fact].get('unit', '')!r}, but the "
                             f"captures print {q} in {units[q]!r}")


def dispatch(keys: dict[str, int]) -> str:
    """smi_values_gen.c: value() as one case per fact of fields.yaml."""
    out = ["/* Generated by shims/nvidia-smi/gen_smi.py from fields.yaml; do not edit. */",
           '#include "smi_values.h"', "",
           "/* One value, without its unit. V_NA / V_DEPRECATED leave `out` unspecified. */",
           "enum vr value(const struct dev *d, int key, char *out, size_t n)", "{",
           "    switch (key) {"]
    for name, row in FACTS.items():
        get = row.get("get")
        body = []
        if "deprecated_from" in row:
            body.append(f"if (g_branch >= {int(row['deprecated_from'])})\n            return V_DEPRECATED;")
        if "na_before" in row:
            body.append(f"if (g_branch < {int(row['na_before'])})\n            return V_NA;")
        if "na_from" in row:
            body.append(f"if (g_branch >= {int(row['na_from'])})\n            return V_NA;")
        if row.get("na_in_mig"):
            body.append("if (mig_enabled(d->index))\n            return V_NA;")
        if get is None and not body:
            continue
        if get is None:
            call = "V_NA"
        elif get[0].isupper():
            call = get
        else:
            fn, args = get.split("(", 1)
            call = f"{fn}(d, out, n{', ' if args != ')' else ''}{args}"
        body.append(f"return {call};")
        if len(body) == 1:
            out.append(f"    case {ident(name)}: {body[0]}")
        else:
            out.append(f"    case {ident(name)}:")
            out += [f"        {b}" for b in body]
    out += ["    default:", "        return V_NA;", "    }", "}", ""]
    return "\n".join(out)


def facts_c() -> str:
    out = ["/* Each fact's name and unit (-q, -q -x), whether --query-gpu prints its N/A bare and whether -q and",
           "   -q -x join the unit to the value. */",
           "const struct fact FACTS[K_COUNT] = {"]
    for name, row in FACTS.items():
        out.append(f'    [{ident(name)}] = {{"{name}", "{row.get("unit", "")}", {int(bool(row.get("na_plain")))}, '
                   f'{int(bool(row.get("unit_joined")))}}},')
    out.append("};\n")
    return "\n".join(out)


def c_args(text: str) -> list[str]:
    """The arguments of a C call's argument list, split at its top-level commas."""
    args, depth, quoted, cur = [], 0, False, ""
    for ch in text:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "([":
            depth += 1
        elif not quoted and ch in ")]":
            depth -= 1
        if ch == "," and not depth and not quoted:
            args.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [a for a in args + [cur.strip()] if a]


def python_table() -> str:
    """mokkafs/model/smi_fields.py: the same table for Python (the profile importer and recorder,
    the cross-surface probe)."""
    out = ['"""nvidia-smi\'s field table for Python: generated by shims/nvidia-smi/gen_smi.py from',
           "shims/nvidia-smi/fields.yaml (whose header says what each column means); do not edit.", "",
           "`FIELDS` holds one `Field` per fact a GPU shows; `nvml` is the NVML getter its value comes from",
           "and `nvml_args` the arguments after the device handle, where the getter is one NVML call.", '"""',
           "from __future__ import annotations", "", "from typing import NamedTuple", "", "",
           "class Field(NamedTuple):",
           "    name: str",
           "    query: tuple[str, ...] = ()  # --query-gpu names",
           "    unit: str = \"\"",
           "    get: str | None = None  # the getter as fields.yaml writes it",
           "    nvml: str | None = None",
           "    nvml_args: tuple[str, ...] = ()",
           "    q: tuple[str, ...] = ()  # -q label paths, newest branch first",
           "    x: tuple[str, ...] = ()  # -q -x element paths, newest branch first",
           "    suffix: str = \"\"",
           "    profile: str | None = None  # the GPU profile key read from it", "", "",
           "FIELDS: dict[str, Field] = {"]
    for name, row in FACTS.items():
        get = row.get("get")
        nvml, nvml_args = None, ()
        if get and get[0].isupper():
            shape, args = get.split("(", 1)
            args = c_args(args[:-1])
            at = next((i for i, a in enumerate(args) if re.fullmatch(r"nvml\w+", a)), None)
            if at is not None:
                nvml = args[at]
                nvml_args = tuple(args[at + 1:]) if shape in ("STR", "SCALAR", "U32", "WATTS") else ()
        query = tuple(([] if name.startswith("x.") else [name]) + _paths(row.get("also")))
        values = {"query": query, "unit": row.get("unit", ""), "get": get, "nvml": nvml, "nvml_args": nvml_args,
                  "q": tuple(_paths(row.get("q"))), "x": tuple(_paths(row.get("x"))),
                  "suffix": row.get("suffix", ""), "profile": row.get("profile")}
        given = "".join(f", {k}={v!r}" for k, v in values.items() if v not in ((), "", None))
        out.append(f"    {name!r}: Field({name!r}{given}),")
    out += ["}", "# The fact a GPU profile key is read from.",
            "BY_PROFILE: dict[str, Field] = {f.profile: f for f in FIELDS.values() if f.profile}",
            "# A -q label path -> the -q -x element path of the same value in the same layout.",
            "TEXT_TO_XML: dict[str, str] = {",
            "    q: f.x[i if len(f.x) == len(f.q) else 0] for f in FIELDS.values() if f.x for i, q in enumerate(f.q)",
            "}", ""]
    return "\n".join(out)


def generate() -> dict[Path, str]:
    h100 = (CAPTURES / TEXT_H100).read_text()
    l40s = (CAPTURES / TEXT_L40S).read_text()
    captured = {590: h100, 595: l40s}
    fields_of = {b: query_fields(text) for b, text in captured.items()}
    units: dict[str, tuple[str, str, str]] = {}
    for b in captured:
        for f in fields_of[b]:
            if f[0] in units and units[f[0]][2] != f[2]:
                raise SystemExit(f"{f[0]}: unit {units[f[0]][2]!r} at 590, {f[2]!r} at 595")
            units.setdefault(f[0], f)
    check_fields(list(units.values()))
    fields = fields_of[590]
    keys: dict[str, int] = {}
    for k in list(FACTS) + list(DYNAMIC.values()):
        keys.setdefault(k, len(keys))
    decl = ["/* Generated by shims/nvidia-smi/gen_smi.py from tests/fixtures/captures and fields.yaml; do not "
            "edit. */", "#ifndef SMI_GEN_H", "#define SMI_GEN_H", "",
            "/* The facts of fields.yaml, then the lists -q and -q -x build at run time. */",
            "enum key {", "    K_NONE = -1,"]
    decl += [f"    {ident(k)} = {v}," for k, v in keys.items()]
    decl += ["    K_COUNT", "};", "",
             "struct fact { const char *name, *unit; unsigned char na_plain, unit_joined; };",
             "struct qfield { const char *name, *alias, *unit; enum key key; };",
             "struct skel { signed char depth, kind; short key; const char *tag, *suffix; };",
             "struct board { const char *profile, *product; const struct skel *xml; };",
             "struct frame { int width, ts_pad, w_smi, w_drv, w_cuda;",
             "               const char *rule, *grid, *head, *row_rule, *gap, *procs_head, *no_procs; };",
             "struct branch { int branch, colon, dtd, unknown_rc; const char *unknown;",
             "                const char *help, *help_query_gpu, *help_query_apps, *help_query_accounted,",
             "                *help_query_retired, *help_query_remapped;",
             "                const struct qfield *fields; const struct skel *text, *text_display, *xml;",
             "                struct frame table; };",
             "/* A branch of the text captures (590, 595): its help texts (-h without its first line) and",
             "   --query-gpu fields. */",
             "struct captured { int branch; const char *help, *help_query_gpu, *help_query_apps, *help_query_accounted,",
             "                  *help_query_retired; const struct qfield *fields; };", ""]
    parts = ["/* Generated by shims/nvidia-smi/gen_smi.py from tests/fixtures/captures and fields.yaml; do not "
             "edit. */", '#include "smi_gen.h"', "", facts_c()]
    parts.append(f'const char HELP_VERSION[] = "{section(h100, "capabilities :: help (-h)").split(" -- v", 1)[1].split(chr(10), 1)[0]}";\n')
    for b, text in captured.items():
        parts.append(f"static const struct qfield QUERY_GPU_FIELDS_{b}[] = {{")
        parts += [f'    {{"{n}", "{a}", "{u}", {ident(QUERY_FACT[n]) if n in QUERY_FACT else "K_NONE"}}},'
                  for n, a, u in fields_of[b]]
        parts.append("    {0, 0, 0, K_NONE},\n};\n")
        for var, title in [("HELP_TEXT", "capabilities :: help (-h)"),
                           ("HELP_QUERY_GPU", "capabilities :: help-query-gpu"),
                           ("HELP_QUERY_COMPUTE_APPS", "capabilities :: help-query-compute-apps"),
                           ("HELP_QUERY_ACCOUNTED_APPS", "capabilities :: help-query-accounted-apps"),
                           ("HELP_QUERY_RETIRED_PAGES", "capabilities :: help-query-retired-pages")]:
            body = section(text, title)
            parts.append(f"static const char {var}_{b}[] =\n{c_str(help_body(body) if var == 'HELP_TEXT' else body)};\n")
    parts.append("const struct captured CAPTURED[] = {")
    parts += [f"    {{{b}, HELP_TEXT_{b}, HELP_QUERY_GPU_{b}, HELP_QUERY_COMPUTE_APPS_{b}, HELP_QUERY_ACCOUNTED_APPS_{b},\n"
              f"     HELP_QUERY_RETIRED_PAGES_{b}, QUERY_GPU_FIELDS_{b}}}," for b in captured]
    parts.append("    {0},\n};\n")
    boards = []
    for b in XML_BOARDS:
        product, rows = xml_skeleton(CAPTURES / f"nvidia-smi-q-x.{b}.xml")
        parts.append(rows_c(f"XML_{b.upper()}", rows, keys))
        boards.append((b, product))
    parts.append("const struct board XML_BOARDS[] = {")
    parts += [f'    {{"{b}", "{p}", XML_{b.upper()}}},' for b, p in boards]
    parts.append("    {0, 0, 0},\n};\n")
    parts.append(rows_c("TEXT_590", text_skeleton(h100), keys, exported=True))
    parts.append(rows_c("TEXT_595", text_skeleton(l40s), keys, exported=True))
    parts.append(f"const int TEXT_590_COLON = {colon_column(section(h100, 'idle :: query (-q)').splitlines())}, "
                 f"TEXT_595_COLON = {colon_column(section(l40s, 'idle :: query (-q)').splitlines())};\n")
    parts += branch_parts(fields, keys)
    decl += ["extern const struct fact FACTS[K_COUNT];",
             "/* The driver version the captures' -h is headed by (590's). */",
             "extern const char HELP_VERSION[];",
             "/* The branches of the text captures, oldest first: 570-594 take 590's, 595 and later 595's. */",
             "extern const struct captured CAPTURED[];",
             "/* The -q -x skeleton of each captured board, and the -q skeletons of 590 and 595. */",
             "extern const struct board XML_BOARDS[];",
             "extern const struct skel TEXT_590[], TEXT_595[];",
             "extern const int TEXT_590_COLON, TEXT_595_COLON;",
             "/* The branches recorded from NVIDIA's own nvidia-smi (record_branches.py), oldest first. */",
             "extern const struct branch BRANCHES[];", "", "#endif"]
    return {OUT: "\n".join(decl) + "\n", HERE / "smi_gen.c": "\n".join(parts) + "\n",
            HERE / "smi_values_gen.c": dispatch(keys), PY_OUT: python_table()}


def main() -> int:
    outputs = generate()
    if "--check" in sys.argv[1:]:
        stale = [p.name for p, text in outputs.items() if not p.exists() or p.read_text() != text]
        if stale:
            print(f"{', '.join(stale)} stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    for path, text in outputs.items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
