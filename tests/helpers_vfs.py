"""Render a vfs tree without mounting: resolve paths, and write a whole tree to a directory
(what `cp -a` of the mount would give), so real tools can read it with `-O sysfs.path=`."""
from __future__ import annotations

import os
from pathlib import Path

from mokkafs.model import Node, compose
from mokkafs.model.profiles import load_profile
from mokkafs.render.tree import root
from mokkafs.render.vfs import CharDev, Ctx, Dir, File, Symlink, Tree

NOW = 1_700_000_000.0


def make_node(profile: str = "h100", **kw) -> Node:
    kw.setdefault("hostname", "testhost")
    return Node(compose(load_profile(profile), **kw), NOW)


def tree_for(node: Node, state_dir: str | None = None) -> Tree:
    return Tree(root(node.config, state_dir=state_dir))


def follow(tree: Tree, ctx: Ctx, path: str) -> str:
    """`path` with every symlink on the way resolved, as the kernel would (relative links only)."""
    parts = [p for p in path.split("/") if p]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            done.pop()
            continue
        e = tree.resolve("/".join(done + [part]), ctx)
        if isinstance(e, Symlink) and (parts or True):
            hops += 1
            assert hops < 40, path
            parts = e.resolve(ctx).split("/") + parts
            continue
        done.append(part)
    return "/".join(done)


def read(node: Node, path: str, tree: Tree | None = None) -> bytes:
    tree = tree or tree_for(node)
    path = follow(tree, Ctx(node, NOW), path)
    entry = tree.resolve(path, Ctx(node, NOW))
    assert isinstance(entry, File), f"{path}: {entry!r}"
    return entry.read(Ctx(node, NOW))


def entry(node: Node, path: str, tree: Tree | None = None):
    tree = tree or tree_for(node)
    return tree.resolve(path, Ctx(node, NOW))


def listdir(node: Node, path: str, tree: Tree | None = None) -> list[str]:
    tree = tree or tree_for(node)
    e = tree.resolve(path, Ctx(node, NOW))
    assert isinstance(e, Dir), path
    return sorted(e.children(Ctx(node, NOW)))


def dump(node: Node, subtree: str, dest: Path, tree: Tree | None = None) -> None:
    """Write `subtree` of the node's tree under `dest` (char devices are skipped)."""
    tree = tree or tree_for(node)
    ctx = Ctx(node, NOW)
    start = tree.resolve(subtree, ctx)
    assert isinstance(start, Dir), subtree

    def walk(d: Dir, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        for name, e in d.children(ctx).items():
            target = out / name
            if isinstance(e, Dir):
                walk(e, target)
            elif isinstance(e, Symlink):
                os.symlink(e.resolve(ctx), target)
            elif isinstance(e, File):
                target.write_bytes(e.read(ctx))
            elif isinstance(e, CharDev):
                continue

    walk(start, dest)
