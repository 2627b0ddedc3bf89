"""Level shims: mokka-cdi-hook, the createContainer hook the agent's CDI spec and the cluster's
containerd base spec run (shims/hook; docs/containers.md), on its own: given an OCI state and a
bundle, it binds SOURCE/driver and SOURCE/devices over the container root's /proc/driver and
/proc/devices, read-only, and refuses anything it should not trust (a link, a
/proc that is no procfs, malformed or oversized JSON) in one line, exit 1, mounting nothing.
Each case runs in a private mount namespace (`unshare -m`), as root, as a runtime runs hooks."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from mokkafs.render import native

pytestmark = pytest.mark.level("shims")

HOOK = native.LIB_DIR.parent / "bin" / native.CDI_HOOK

# In the namespace: make rootfs/proc a procfs (as runc has when it runs the hook), run the hook,
# then report what the container would see and whether anything new is mounted at /proc/driver.
SCRIPT = r"""
set -u
root=$1; shift
if [ "${PROC_AS:-procfs}" = procfs ]; then mount -t proc proc "$root/proc"; fi
before=$(grep -c ' /' /proc/self/mountinfo)
"$@" <"$STATE"
rc=$?
if [ -n "${TWICE:-}" ]; then "$@" <"$STATE"; rc=$rc$?; fi
after=$(grep -c ' /' /proc/self/mountinfo)
echo "rc=$rc mounts=$((after - before))"
if [ -e "$root/proc/driver/nvidia/version" ]; then echo "version=$(cat "$root/proc/driver/nvidia/version")"; fi
echo "devices=$(grep -c nvidia-caps "$root/proc/devices" 2>/dev/null)"
if touch "$root/proc/driver/nvidia/x" 2>/dev/null; then echo writable; fi
"""


@pytest.fixture
def bundle(tmp_path):
    assert os.geteuid() == 0, "a hook runs as root, as the runtime does"
    assert HOOK.is_file(), f"{HOOK} missing: pip install -e . builds it"
    root = tmp_path / "bundle" / "rootfs"
    (root / "proc").mkdir(parents=True)
    (tmp_path / "bundle" / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"},
                                                                 "process": {"args": ["sh"]}}))
    source = tmp_path / "proc"
    (source / "driver" / "nvidia").mkdir(parents=True)
    (source / "driver" / "nvidia" / "version").write_text("NVRM version: test\n")
    (source / "devices").write_text("Character devices:\n195 nvidia\n506 nvidia-caps\n")
    return tmp_path


def run_hook(tmp_path: Path, state: str | bytes, *args: str, proc_as: str = "procfs", twice: bool = False):
    """(the hook's exit code, stderr, what the namespace showed after it)."""
    state_file = tmp_path / "state.json"
    state_file.write_bytes(state.encode() if isinstance(state, str) else state)
    argv = list(args) if args else ["proc", str(tmp_path / "proc")]
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", SCRIPT, "sh",
                        str(tmp_path / "bundle" / "rootfs"), str(HOOK), *argv],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "STATE": str(state_file), "PROC_AS": proc_as, "TWICE": "1" if twice else ""})
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr


def state_of(tmp_path: Path, **extra) -> str:
    return json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1,
                       "bundle": str(tmp_path / "bundle"), **extra})


def test_binds_the_source_over_proc_driver_read_only(bundle):
    out, err = run_hook(bundle, state_of(bundle, annotations={"a": "b\u00e9\\\"x"}))
    assert out.splitlines() == ["rc=0 mounts=2", "version=NVRM version: test", "devices=1"], err
    assert err == ""


def test_an_absolute_root_path(bundle):
    config = bundle / "bundle" / "config.json"
    config.write_text(json.dumps({"root": {"readonly": True, "path": str(bundle / "bundle" / "rootfs")}}))
    out, _ = run_hook(bundle, state_of(bundle))
    assert "version=NVRM version: test" in out


def refused(tmp_path: Path, state, expect: str, args: tuple[str, ...] = (), **kw) -> None:
    out, err = run_hook(tmp_path, state, *args, **kw)
    assert out.splitlines()[:1] == ["rc=1 mounts=0"] and "version=" not in out, (out, err)
    assert err.count("\n") == 1 and err.startswith("mokka-cdi-hook: ") and expect in err, err


def test_refuses_a_proc_that_is_a_link(bundle):
    """An image could ship /proc as a link; the hook never follows one it did not make."""
    root = bundle / "bundle" / "rootfs"
    (root / "proc").rmdir()
    (bundle / "elsewhere").mkdir()
    (root / "proc").symlink_to(bundle / "elsewhere")
    refused(bundle, state_of(bundle), "not a directory (a link?)", proc_as="none")


def test_refuses_a_proc_that_is_no_procfs(bundle):
    refused(bundle, state_of(bundle), "not a procfs", proc_as="plain directory")


def test_refuses_a_config_that_is_a_link(bundle):
    config = bundle / "bundle" / "config.json"
    (bundle / "real.json").write_text(config.read_text())
    config.unlink()
    config.symlink_to(bundle / "real.json")
    refused(bundle, state_of(bundle), "config.json")


@pytest.mark.parametrize("state, expect", [
    ("", "not valid JSON"),
    ("not json", "not valid JSON"),
    ("{}", 'no "bundle"'),
    ('{"bundle": 7}', '"bundle" is not a path string'),
    ('{"bundle": "relative/dir"}', "is not absolute"),
    ('{"bundle": "/nonexistent-mokka-bundle"}', "No such file or directory"),
    ('{"bundle": "/x\\u0041"}', '"bundle" is not a path string'),
    ("[" * 200000, "not valid JSON"),
    ('{"bundle": "/tmp"} {}', "not valid JSON"),
    (b'{"bundle": "/tmp\x00x"}', "NUL byte"),
    ("{" + " " * (2 << 20) + "}", "larger than"),
])
def test_refuses_bad_state(bundle, state, expect):
    refused(bundle, state, expect)


@pytest.mark.parametrize("config, expect", [
    ("{}", 'no "root"'),
    ('{"root": {"path": ""}}', "is not a path string"),
    ('{"root": ' + "[" * 100000 + "}", "not valid JSON"),
    ('{"root": {"path": "rootfs"', "not valid JSON"),
    ('{"root": {"path": "rootfs"}}', None),
])
def test_refuses_bad_config(bundle, config, expect):
    (bundle / "bundle" / "config.json").write_text(config)
    if expect is None:  # the control: the smallest config that works
        assert "version=NVRM version: test" in run_hook(bundle, state_of(bundle))[0]
    else:
        refused(bundle, state_of(bundle), expect)


def test_usage(bundle):
    r = subprocess.run([str(HOOK)], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "usage: mokka-cdi-hook proc [--if-present] SOURCE" in r.stderr
    r = subprocess.run([str(HOOK), "proc", "/nonexistent-source"], input=state_of(bundle),
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and r.stderr == "mokka-cdi-hook: /nonexistent-source: No such file or directory\n"


def test_if_present_does_nothing_without_a_node(bundle):
    """A runtime's base spec runs the hook for every container, the node's own agent among them,
    before any node is mounted: with --if-present a missing SOURCE starts the container as it is
    (exit 0, nothing mounted); without it, the same is refused."""
    out, err = run_hook(bundle, state_of(bundle), "proc", "--if-present", str(bundle / "no-node"))
    assert out.splitlines() == ["rc=0 mounts=0", "devices=0"] and err == ""
    refused(bundle, state_of(bundle), "no-node: No such file or directory", args=("proc", str(bundle / "no-node")))
    out, _ = run_hook(bundle, state_of(bundle), "proc", "--if-present", str(bundle / "proc"))
    assert "version=NVRM version: test" in out


def test_refuses_a_source_without_devices_and_binds_nothing(bundle):
    """Both entries are checked before either is bound: a source without its devices file leaves
    the container's /proc as it was."""
    (bundle / "proc" / "devices").unlink()
    refused(bundle, state_of(bundle), "proc/devices: No such file or directory")


def test_a_second_run_finds_its_entries_bound_and_binds_nothing_more(bundle):
    """A container can be given the hook twice (containerd's base spec, then the agent's CDI spec
    under the NVIDIA runtime class): the second run sees SOURCE's entries already there."""
    out, err = run_hook(bundle, state_of(bundle), twice=True)
    assert out.splitlines() == ["rc=00 mounts=2", "version=NVRM version: test", "devices=1"], err
