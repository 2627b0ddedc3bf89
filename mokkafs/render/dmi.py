"""`sys/class/dmi/id`: the machine as its firmware names it, from the node composition's
`system` (GPU feature discovery labels nvidia.com/gpu.machine with product_name)."""
from __future__ import annotations

from mokkafs.model.identity import NodeConfig
from mokkafs.render.vfs import Dir, const, static_dir


def dmi_dir(config: NodeConfig) -> Dir:
    s = config.composition.dmi
    files = {
        "sys_vendor": s.vendor,
        "product_name": s.product,
        "board_vendor": s.vendor,
        "board_name": s.board,
    }
    return static_dir({"id": static_dir({k: const(f"{v}\n") for k, v in files.items()}, mode=0o755)}, mode=0o755)
