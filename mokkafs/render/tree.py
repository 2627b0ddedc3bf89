"""The mount's root: which renderer module serves which top-level directory."""
from __future__ import annotations

from collections.abc import Callable

from mokkafs.model import NodeConfig
from mokkafs.model.topology import Layout, pci_layout
from mokkafs.render import dmi, infiniband, modules, sysfs_pci
from mokkafs.render.control import control_tree
from mokkafs.render.driver import driver_tree
from mokkafs.render.dev import dev_tree
from mokkafs.render.proc_nvidia import proc_tree
from mokkafs.render.vfs import Dir, Entry, const, static_dir


def sys_tree(config: NodeConfig, layout: Layout) -> Dir:
    """sys/: the PCI bus and devices, the InfiniBand classes and the driver's modules."""
    pci = sysfs_pci.PciTree(layout, lambda fn: infiniband.device_children(config, fn))
    return static_dir(
        {
            "bus": static_dir({"pci": pci.bus_pci()}, mode=0o755),
            "devices": static_dir(pci.devices_children(), mode=0o755),
            "class": static_dir({**infiniband.class_dirs(layout, pci.rel_path), "dmi": dmi.dmi_dir(config)}, mode=0o755),
            "module": static_dir(modules.sys_module_children(config), mode=0o755),
        },
        mode=0o755,
    )


def _no_host_modules() -> str:
    return ""


def root(
    config: NodeConfig,
    state_dir: str | None = None,
    scenario_status: Callable[[float], str] | None = None,
    host_modules: Callable[[], str] = _no_host_modules,
    bind_node_socket: bool = False,
) -> Dir:
    """`host_modules` gives the host's /proc/modules at each open of proc/modules (the daemon
    passes mokkafs.daemon.host_modules.HostModules(); without it the list is the driver's modules alone).
    `bind_node_socket`: the daemon binds the node's socket over driver/run/nvidia-persistenced/socket
    (render/driver.py)."""
    top: dict[str, Entry] = dict(control_tree(config.gpus, scenario_status))
    if state_dir is not None:
        # `mokka run` reads this to point MOKKA_STATE at the daemon's shared state file.
        node = dict(top["node"].children(None))
        node["state_dir"] = const(f"{state_dir}\n")
        top["node"] = static_dir(node)
    layout = pci_layout(config)
    top["sys"] = sys_tree(config, layout)
    top["proc"] = proc_tree(config, layout, {"modules": modules.proc_modules_file(config, host_modules)})
    top["dev"] = dev_tree(config, layout)
    if config.hcas:
        top["ib"] = infiniband.control_dir(config)
    top["driver"] = driver_tree(config, top["dev"], top["proc"], state_dir, bind_node_socket)
    return static_dir(top)
