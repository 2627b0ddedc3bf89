"""Level t0: docs/architecture.md stays true. Every module of the package and every hand-written
or generating source of the shims has a row in its module tables, and every row names a file
that exists, so a newcomer's map of the code is never out of date. The tables are ordered by
layer, and the layering holds: no module imports one of a later layer, and the agent's pure
parts import neither the API client nor anything that does I/O."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"


def _modules() -> set[str]:
    pkg = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "mokkafs").rglob("*.py")
        if "_native" not in p.parts and p.name != "__init__.py"
    }
    shims = {
        p.relative_to(REPO).as_posix()
        for ext in ("*.c", "*.h", "*.py")
        for p in (REPO / "shims").rglob(ext)
        # generated outputs and NVIDIA's header are covered by the row of their generator / user
        if not re.search(r"(_gen\.[ch]|_stubs\.c|/nvml\.h)$", p.as_posix())
    }
    return pkg | shims


def _rows() -> set[str]:
    text = DOC.read_text()
    return set(re.findall(r"^\| `([^`]+)`", text, flags=re.M))


def test_every_module_has_a_row():
    missing = sorted(_modules() - _rows())
    assert missing == [], f"docs/architecture.md has no row for: {missing}"


def test_every_row_names_a_file_that_exists():
    gone = sorted(r for r in _rows() if not (REPO / r.rstrip("/")).exists())
    assert gone == [], f"docs/architecture.md names files that do not exist: {gone}"


# --- the layers --------------------------------------------------------------------------------


def _layers(text: str) -> dict[str, int]:
    """Each row's file -> the number of the `## N. title` section its table is in. A row outside
    every layer is an error: a module without a layer cannot be checked."""
    layer, out, stray = None, {}, []
    for line in text.splitlines():
        if m := re.match(r"## (\d+)\. ", line):
            layer = int(m.group(1))
        elif line.startswith("## "):
            layer = None
        elif m := re.match(r"\| `([^`]+)` \|", line):
            (stray.append(m.group(1)) if layer is None else out.__setitem__(m.group(1), layer))
    assert stray == [], f"docs/architecture.md has rows outside a numbered layer: {stray}"
    return out


def _module_layer(layers: dict[str, int], dotted: str) -> int | None:
    """The layer of module `mokkafs.x.y` (a file's row), or of package `mokkafs.x` (the latest
    layer among its modules' rows: importing a package runs its __init__ only)."""
    path = dotted.replace(".", "/")
    if f"{path}.py" in layers:
        return layers[f"{path}.py"]
    inside = [n for f, n in layers.items() if f.startswith(f"{path}/")]
    return max(inside) if inside else None


def _imports(rel: str, source: str) -> list[tuple[int, str]]:
    """(line, module) for each mokkafs module the file `rel` imports, at any depth (a command's
    lazy import counts); `from mokkafs.x import y` is module `mokkafs.x.y` where that is one."""
    package = rel.removesuffix(".py").split("/")[:-1]
    out = []
    for node in ast.walk(ast.parse(source, rel)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package, up level - 1
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            for a in node.names:
                sub = f"{base}.{a.name}"
                path = REPO / sub.replace(".", "/")
                out.append((node.lineno, sub if path.with_suffix(".py").exists() or path.is_dir() else base))
    return sorted({(line, m) for line, m in out if m == "mokkafs" or m.startswith("mokkafs.")})


def _breaches(rel: str, source: str, layers: dict[str, int]) -> list[str]:
    """What file `rel` imports against the layers (a package's __init__ is in its package's layer)."""
    own = layers.get(rel) or _module_layer(layers, rel.removesuffix("/__init__.py").replace("/", "."))
    if own is None:  # mokkafs/__init__.py: the package itself imports nothing of ours
        return []
    out = []
    for line, module in _imports(rel, source):
        theirs = _module_layer(layers, module)
        if theirs is None and module != "mokkafs":
            out.append(f"{rel}:{line} imports {module}, which has no row")
        elif theirs is not None and theirs > own:
            out.append(f"{rel}:{line} (layer {own}) imports {module} (layer {theirs})")
    return out


EDGES = ("mokkafs/fuse_ops.py", "mokkafs/shm/layout.py", "mokkafs/shm/publisher.py", "mokkafs/shm/proctable.py",
         "mokkafs/metrics.py", "mokkafs/mirror.py", "mokkafs/kmsg.py", "mokkafs/persist.py")


def test_no_module_imports_a_later_layer():
    """The pure layers above all: nothing in mokkafs/model imports mokkafs.render, mokkafs.shm or
    an edge, nothing in mokkafs/render imports an edge; and so on up the document."""
    layers = _layers(DOC.read_text())
    model = [n for f, n in layers.items() if f.startswith("mokkafs/model/")]
    render = [n for f, n in layers.items() if f.startswith("mokkafs/render/")]
    assert model and render and max(model) < min(render), "the model comes before the renderers"
    assert max(render) < min(layers[e] for e in EDGES), "the renderers come before the edges"
    files = {f for f in layers if f.startswith("mokkafs/") and f.endswith(".py")}
    files |= {p.relative_to(REPO).as_posix() for p in (REPO / "mokkafs").rglob("__init__.py") if "_native" not in p.parts}
    breaches = [b for rel in sorted(files) for b in _breaches(rel, (REPO / rel).read_text(), layers)]
    assert breaches == [], "imports against the layers of docs/architecture.md:\n" + "\n".join(breaches)


def test_the_layer_check_sees_a_breach():
    """The check reads imports as Python does: a model module importing the publisher, a
    renderer an edge (from a package, lazily, relatively), each is caught."""
    layers = _layers(DOC.read_text())
    for rel, source, culprit in (
        ("mokkafs/model/node.py", "from mokkafs.shm.publisher import Publisher\n", "mokkafs.shm.publisher"),
        ("mokkafs/model/node.py", "def f():\n    from mokkafs.render import tree\n", "mokkafs.render.tree"),
        ("mokkafs/model/xid.py", "import mokkafs.fuse_ops\n", "mokkafs.fuse_ops"),
        ("mokkafs/model/__init__.py", "from ..render import metrics\n", "mokkafs.render.metrics"),
        ("mokkafs/render/tree.py", "from mokkafs import mirror\n", "mokkafs.mirror"),
        ("mokkafs/render/driver.py", "from ..shm import layout\n", "mokkafs.shm.layout"),
    ):
        found = _breaches(rel, source, layers)
        assert len(found) == 1 and culprit in found[0], (rel, source, found)
    assert _breaches("mokkafs/render/tree.py", "from mokkafs.model import Node\nfrom mokkafs import vfs\n", layers) == []


AGENT_PURE = ("grammar", "decisions", "node_files")
# The API client and the modules through which Python reaches files, processes, the network,
# signals or the clock; `watch` is the agent's edge and holds all of that.
NOT_PURE = {"kubernetes", "urllib3", "os", "io", "pathlib", "shutil", "subprocess", "socket", "signal",
            "time", "datetime", "mokkafs.agent.watch"}


def test_the_agents_pure_parts_do_no_io():
    for name in AGENT_PURE:
        file = REPO / "mokkafs" / "agent" / f"{name}.py"
        tree = ast.parse(file.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        bad = sorted(m for m in imported if m in NOT_PURE or m.split(".")[0] in NOT_PURE)
        opens = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "open"]
        assert bad == [] and opens == [], f"mokkafs/agent/{name}.py is pure, yet imports {bad}, opens at {opens}"
