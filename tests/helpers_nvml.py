"""Helpers for the NVML shim tests: where the built library is, a published state file
without a mount, and the environment a consumer process needs."""
from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

import pytest

from mokkafs.render import native
from mokkafs.model import Node, compose
from mokkafs.model.profiles import load_profile
from mokkafs.model.schema import GpuProfile
from mokkafs.daemon.shm.publisher import Publisher


def nvml_path() -> Path:
    try:
        return native.nvml_library()
    except FileNotFoundError as e:
        pytest.skip(f"libnvidia-ml.so.1 not built ({e}); run `pip install -e .`")


def consumer_env(state: Path) -> dict[str, str]:
    env = dict(os.environ, MOKKA_STATE=str(state))
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(nvml_path().parent), env.get("LD_LIBRARY_PATH")]))
    return env


class Published:
    """A node published into `<dir>/state` by an in-process Publisher (no FUSE)."""

    def __init__(self, directory: Path, profile: str | GpuProfile = "h100", gpus: int | None = None,
                 driver_version: str | None = None, cuda_version: str | None = None) -> None:
        board = load_profile(profile) if isinstance(profile, str) else profile
        self.node = Node(compose(board, gpus=gpus, driver_version=driver_version, cuda_version=cuda_version),
                         time.time())
        self.path = directory / "state"
        self.publisher = Publisher(self.path)
        self.publisher.open()
        self.publisher.publish(self.node)

    def apply(self, event) -> None:
        self.publisher(self.node, self.node.apply(event, time.time()))

    def close(self) -> None:
        self.publisher.close()


SUCCESS, UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND, INSUFFICIENT_SIZE = 0, 1, 2, 3, 6, 7
UNKNOWN = 999  # NVML_ERROR_UNKNOWN: what a setter answers when no daemon does


class Nvml:
    """ctypes access to the built library, loaded into this process."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL(str(nvml_path()))

    def __getattr__(self, name: str):
        return getattr(self.lib, name)
