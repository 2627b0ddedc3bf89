"""The mount's root: which renderer module serves which top-level directory."""
from __future__ import annotations

from mokkafs.model import NodeConfig
from mokkafs.render.control import control_tree
from mokkafs.render.driver import driver_tree
from mokkafs.vfs import Dir, Entry, static_dir


def root(config: NodeConfig) -> Dir:
    top: dict[str, Entry] = dict(control_tree(config.gpus))
    top["driver"] = driver_tree(config)
    return static_dir(top)
