"""The tree is the map. A module's layer is its folder (`mokkafs/model`, `render`,
`daemon`, `cli` and `agent`), and no module imports one of a later layer; the agent's pure parts
import neither the API client nor anything that does I/O. docs/architecture.md stays true: every
module of the package and every hand-written or generating source of the shims has a row under its
folder's heading, and every row names a file that exists."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest


pytestmark = pytest.mark.level("model")

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

# The package's folders in layer order: a module imports from its own folder and the folders
# before it, never a later one. `cli` and `agent` are one layer (what a user or a cluster runs).
LAYERS = ("model", "render", "daemon", ("cli", "agent"))
# Inside the daemon, the lifetime builds the edges; no edge imports it.
LIFETIME = "mokkafs.daemon.lifetime"


def _layer(dotted: str) -> int | None:
    """The layer of module or package `mokkafs.x...`, from its folder alone: 0 for the package
    itself, None for what is not a layer (the data folders, the built shims)."""
    parts = dotted.split(".")
    if parts == ["mokkafs"]:
        return 0
    for n, names in enumerate(LAYERS, start=1):
        if parts[1] in ((names,) if isinstance(names, str) else names):
            return n
    return None


def _files() -> list[str]:
    return sorted(
        p.relative_to(REPO).as_posix()
        for p in (REPO / "mokkafs").rglob("*.py")
        if "_native" not in p.parts
    )


def _dotted(rel: str) -> str:
    return rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def test_every_module_sits_in_a_layer_folder():
    """A module outside the layer folders could not be checked: there are none."""
    stray = [rel for rel in _files() if _layer(_dotted(rel)) is None]
    assert stray == [], f"modules outside the layer folders {LAYERS}: {stray}"
    top = sorted(p.name for p in (REPO / "mokkafs").iterdir() if p.suffix == ".py" and p.name != "__init__.py")
    assert top == [], f"mokkafs/ itself holds only the layer packages and data: {top}"


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


def _breaches(rel: str, source: str) -> list[str]:
    """What file `rel` imports against the layers its folders say."""
    own = _layer(_dotted(rel))
    out = []
    for line, module in _imports(rel, source):
        theirs = _layer(module)
        if theirs is None:
            out.append(f"{rel}:{line} imports {module}, which is in no layer folder")
        elif theirs > own:
            out.append(f"{rel}:{line} ({_dotted(rel)}, layer {own}) imports {module} (layer {theirs})")
        elif module == LIFETIME and own == _layer(LIFETIME) and _dotted(rel) != LIFETIME:
            out.append(f"{rel}:{line}: an edge imports the daemon's lifetime")
    return out


def test_no_module_imports_a_later_layer():
    """Nothing in model/ imports render/, daemon/ or cli/; nothing in render/ imports an edge;
    no edge imports the lifetime; and so on up the folders."""
    breaches = [b for rel in _files() for b in _breaches(rel, (REPO / rel).read_text())]
    assert breaches == [], "imports against the layers:\n" + "\n".join(breaches)


def test_the_layer_check_sees_a_breach():
    """The check reads imports as Python does: a model module importing the publisher, a
    renderer an edge (from a package, lazily, relatively), an edge the lifetime; each is caught."""
    for rel, source, culprit in (
        ("mokkafs/model/node.py", "from mokkafs.daemon.shm.publisher import Publisher\n", "mokkafs.daemon.shm.publisher"),
        ("mokkafs/model/node.py", "def f():\n    from mokkafs.render import tree\n", "mokkafs.render.tree"),
        ("mokkafs/model/xid.py", "import mokkafs.daemon.fuse_ops\n", "mokkafs.daemon.fuse_ops"),
        ("mokkafs/model/__init__.py", "from ..render import metrics\n", "mokkafs.render.metrics"),
        ("mokkafs/render/tree.py", "from mokkafs.daemon import mirror\n", "mokkafs.daemon.mirror"),
        ("mokkafs/render/driver.py", "from ..daemon.shm import layout\n", "mokkafs.daemon.shm.layout"),
        ("mokkafs/daemon/mirror.py", "from mokkafs.cli import main\n", "mokkafs.cli.main"),
        ("mokkafs/daemon/fuse_ops.py", "from mokkafs.daemon.lifetime import Options\n", "lifetime"),
    ):
        found = _breaches(rel, source)
        assert len(found) == 1 and culprit in found[0], (rel, source, found)
    assert _breaches("mokkafs/render/tree.py", "from mokkafs.model import Node\nfrom mokkafs.render import vfs\n") == []
    assert _breaches("mokkafs/cli/main.py", "from mokkafs.daemon.lifetime import serve\n") == []


# --- the map: docs/architecture.md is checked against the tree -----------------------------------


def _sections(text: str) -> dict[str, str | None]:
    """Each row's file -> the folder its section's heading names (a `mokkafs/x/` in backticks), or
    None for a section that names none (the shims, deploy and tooling)."""
    folder, out = None, {}
    for line in text.splitlines():
        if line.startswith("## "):
            m = re.search(r"`((?:mokkafs|shims)/[^`]*/)`", line)
            folder = m.group(1) if m else None
        elif m := re.match(r"\| `([^`]+)` \|", line):
            out[m.group(1)] = folder
    return out


def test_every_row_sits_in_its_folders_section():
    wrong = sorted(f"{row} (under {folder})" for row, folder in _sections(DOC.read_text()).items()
                   if folder is not None and not row.startswith(folder))
    assert wrong == [], f"docs/architecture.md lists modules under another folder's heading: {wrong}"


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


# --- the repository stands alone -----------------------------------------------------------------

# What a clone from the project's home does not have: files beside the checkout, and the numbers
# of the tracker's issues (an external project's issue is cited by its repository: owner/repo#N).
OUTSIDE = re.compile(r"\.\./shared|shared/reference|\b[Ii]ssues? \d+")


def _tracked_text_files() -> list[Path]:
    import subprocess

    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    out = []
    for n in names:
        p = REPO / n.decode()
        if n and p.is_file() and not p.is_symlink() and p.suffix not in (".gz", ".png", ".so"):
            out.append(p)
    return out


def test_the_repository_cites_nothing_outside_it():
    """Docs, code, comments and scripts cite nothing a clone lacks: no `../shared`, no issue of
    the tracker by number (this file's own pattern aside)."""
    found = []
    for p in _tracked_text_files():
        if p == Path(__file__).resolve():
            continue
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{p.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert found == [], "the repository cites what a clone lacks:\n" + "\n".join(found)


def test_the_outside_check_sees_a_citation():
    for line in ("see ../shared/DESIGN.md", "(issue 16's N/A count)", "Issue 4. Formats", "shared/reference/x"):
        assert OUTSIDE.search(line), line
    for line in ("NVIDIA/DCGM issue #232", "open-mpi/hwloc#658", "a GPU issue", "tissue 3"):
        assert not OUTSIDE.search(line), line
