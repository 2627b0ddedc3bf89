"""NVIDIA's mig-parted (the version scripts/go-tools.txt pins), unmodified: `apply`, `assert` and
`export` of NVIDIA's own layout names (all-disabled, all-1g.10gb, all-balanced) and a mixed one,
on a mounted H100 node under `mokka run`.

mig-parted reads /proc/modules before anything else (cmd/nvidia-mig-parted/util/nvml.go,
IsNvidiaModuleLoaded: with `nvidia` listed it drives MIG through NVML, without it it walks PCI
and resets boards through sysfs), and `apply`, `assert` and `export` all stop with "unable to read
/proc/modules" where the file is missing. On a kernel without module support there is no such
file, and none can be added to a procfs: those runs go through tests/with_proc_modules.sh, which
gives mig-parted a /proc that is the kernel's plus the node's `proc/modules`."""
from __future__ import annotations

import subprocess

import pytest
import yaml

from helpers_go import mig_parted_cmd

pytestmark = pytest.mark.level("tools")


CONFIG = {
    "version": "v1",
    "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-1g.10gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}],
        # NVIDIA's default config's all-balanced for H100 80GB (device id 0x233010DE).
        "all-balanced": [{"device-filter": ["0x233010DE"], "devices": "all", "mig-enabled": True,
                          "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}],
        "mixed": [{"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 1, "4g.40gb": 1}},
                  {"devices": [1], "mig-enabled": False}],
    },
}


def mig_parted(node, tmp_path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    extra = ["-f", str(config)] if args[0] in ("apply", "assert") else []
    r = subprocess.run(mig_parted_cmd(node.mnt, *args, *extra), env=node.env,
                       capture_output=True, text=True, timeout=180, cwd="/")
    if check:
        assert r.returncode == 0, (args, r.stdout[-2000:], r.stderr[-3000:])
    return r


def layout(node, gpu: int) -> list[str]:
    """The GPU instances' profiles on `gpu`, from the node's own MIG file."""
    text = node.read(f"gpu{gpu}/mig")
    if "mode: enabled" not in text:
        return ["disabled"]
    return sorted(line.split()[3] for line in text.splitlines() if line.startswith("gi "))


WANT = {
    "all-disabled": [["disabled"], ["disabled"]],
    "all-1g.10gb": [["1g.10gb"] * 7] * 2,
    "all-balanced": [["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]] * 2,
    "mixed": [["3g.40gb", "4g.40gb"], ["disabled"]],
}


def exported(node, tmp_path) -> list[dict]:
    out = yaml.safe_load(mig_parted(node, tmp_path, "export").stdout)
    assert out["version"] == "v1"
    return out["mig-configs"]["current"]


@pytest.mark.parametrize("name", list(WANT))
def test_apply_assert_export(node_factory, tmp_path, name):
    node = node_factory("h100", gpus=2)
    # mig-parted puts two same-profile devices into one GPU instance first (for 1c.2g.20gb pairs
    # and the like: pkg/mig/config/config.go, reuseGI) and, refused, creates a GPU instance for
    # the second: the node logs each refusal, as the driver returns it.
    node.expect_warning(r"insufficient_resources from uid 0")
    if name == "all-disabled":  # start from something to undo
        mig_parted(node, tmp_path, "apply", "-c", "all-balanced")
    mig_parted(node, tmp_path, "apply", "-c", name)
    assert [layout(node, 0), layout(node, 1)] == WANT[name]
    mig_parted(node, tmp_path, "assert", "-c", name)
    other = list(WANT)[(list(WANT).index(name) + 1) % len(WANT)]  # and assert can fail
    assert mig_parted(node, tmp_path, "assert", "-c", other, check=False).returncode != 0, other
    current = exported(node, tmp_path)
    got = []
    for entry in current:
        devices = [0, 1] if entry["devices"] == "all" else entry["devices"]
        for d in devices:
            if not entry["mig-enabled"]:
                got.append((d, ["disabled"]))
            else:
                got.append((d, sorted(p for p, n in (entry.get("mig-devices") or {}).items() for _ in range(n))))
    assert sorted(got) == [(0, WANT[name][0]), (1, WANT[name][1])]
