#!/usr/bin/env python3
"""Records what NVIDIA's own nvidia-smi of each Debian-shipped branch prints, as the ground truth
of our nvidia-smi's per-branch layouts: gen_smi.py reads these records (with the 570+ captures)
and writes the per-branch tables of smi_gen.h.

    shims/nvidia-smi/record_branches.py [--mig] [BRANCH...]     (default: 470 525 535 550)

Needs the binaries of scripts/fetch_nvidia_smi.sh and a mount: for each branch it mounts a
one-GPU node at that driver version (a100 for 470, which cannot drive Hopper; h100 from 525),
runs the real binary on our NVML and writes tests/fixtures/nvidia-smi-branches/<branch>/:
help.txt, help-query-gpu.txt, help-query-compute-apps.txt, help-query-accounted-apps.txt,
help-query-retired-pages.txt, help-query-remapped-rows.txt, unknown-option.txt (what an argument the
tool does not know prints, and on its last line the exit code), query.txt (-q), query.xml (-q -x),
query-display.txt (-q -d with every section -h lists: the layout -d selects from, with the
sample blocks only -d prints), table.txt (the default table), query-gpu.csv (every field by its first name, then every alias:
the header gives each field's unit and the name the tool prints for it), version (the package).
And mig/, with MIG on (record_mig): the profile and instance listings, the default table, -q and
-q -x of a partitioned GPU, and what each MIG command prints, with its exit code.
Values in the records are one moment of one node; gen_smi.py uses only their layout."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = ROOT / "tests" / "fixtures" / "nvidia-smi-branches"
CACHE = Path(os.environ.get("MOKKA_NVIDIA_SMI_CACHE", ROOT / ".cache" / "nvidia-smi"))
BRANCHES = (470, 525, 535, 550)
PROFILE = {470: "a100"}  # the others: h100


def field_names(help_text: str) -> tuple[list[str], list[str]]:
    """(first names, aliases) of --help-query-gpu, in its order."""
    names, aliases = [], []
    for line in help_text.splitlines():
        m = re.fullmatch(r'"([^"]+)"(?: or "([^"]+)")?', line)
        if m and "." in m.group(1) + "." and not line.startswith('"Default"'):
            names.append(m.group(1))
            if m.group(2):
                aliases.append(m.group(2))
    return names, aliases


def display_sections(help_text: str) -> list[str]:
    """The -d sections -h lists."""
    block = help_text.split("--display=", 1)[1].split("Flags can be combined", 1)[0]
    return re.findall(r"[A-Z][A-Z_]+", block)


def record(branch: int) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import world_readable_node

    binary = CACHE / str(branch) / "nvidia-smi"
    if not binary.is_file():
        raise SystemExit(f"{binary} missing: run scripts/fetch_nvidia_smi.sh")
    package = (CACHE / str(branch) / "version").read_text().strip()
    version = package.split()[1].split("-")[0]
    out = OUT / str(branch)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for node in world_readable_node(PROFILE.get(branch, "h100"), 1, ("--driver-version", version)):
        env = {k: v for k, v in os.environ.items() if k != "MOKKA_STATE"}
        env["LD_LIBRARY_PATH"] = str(node.mnt / "driver" / "usr" / "lib64")

        def run(*args: str) -> str:
            r = subprocess.run([str(binary), *args], capture_output=True, text=True, env=env, timeout=60)
            if r.returncode != 0:
                raise SystemExit(f"nvidia-smi {branch} {' '.join(args)[:80]}: exit {r.returncode}\n{r.stdout}{r.stderr}")
            return r.stdout

        (out / "version").write_text(package + "\n")
        help_text = run("-h")
        (out / "help.txt").write_text(help_text)
        help_gpu = run("--help-query-gpu")
        (out / "help-query-gpu.txt").write_text(help_gpu)
        for what in ("compute-apps", "accounted-apps", "retired-pages", "remapped-rows"):
            (out / f"help-query-{what}.txt").write_text(run(f"--help-query-{what}"))
        r = subprocess.run([str(binary), "--no-such-option"], capture_output=True, text=True, env=env, timeout=60)
        (out / "unknown-option.txt").write_text(f"{r.stdout}{r.returncode}\n")
        (out / "query.txt").write_text(run("-q"))
        (out / "query.xml").write_text(run("-q", "-x"))
        (out / "query-display.txt").write_text(run("-q", "-d", ",".join(display_sections(help_text))))
        (out / "table.txt").write_text(run())
        names, aliases = field_names(help_gpu)
        csv = run(f"--query-gpu={','.join(names)}", "--format=csv")
        csv += run(f"--query-gpu={','.join(aliases)}", "--format=csv")
        (out / "query-gpu.csv").write_text(csv)
    record_mig(branch, binary, version, out / "mig")


# What record_mig runs, in order, on GPU 0 with MIG on (file name, arguments). The layout is the
# issue's 3g + 2g + 1g (profile ids 9, 14, 19 on A100 and H100); then a GPU instance that does not
# fit, a compute instance destroyed and made again, and both kinds destroyed.
MIG_STEPS = (
    ("mig-enable.txt", ("-i", "0", "-mig", "1")),
    ("lgip.txt", ("mig", "-lgip")),
    ("lgipp.txt", ("mig", "-lgipp")),
    ("lgi-none.txt", ("mig", "-lgi")),
    ("cgi.txt", ("mig", "-cgi", "9,14,19", "-C")),
    ("lgi.txt", ("mig", "-lgi")),
    ("lci.txt", ("mig", "-lci")),
    ("lcip.txt", ("mig", "-lcip")),
    ("table.txt", ()),
    ("query.txt", ("-q",)),
    ("query.xml", ("-q", "-x")),
    ("list.txt", ("-L",)),
    ("cgi-full.txt", ("mig", "-cgi", "9")),
    ("dci.txt", ("mig", "-dci", "-gi", "2", "-ci", "0")),
    ("lci-gi.txt", ("mig", "-lci", "-gi", "2")),
    ("cci.txt", ("mig", "-cci", "-gi", "2")),
    ("dci-missing.txt", ("mig", "-dci", "-gi", "2", "-ci", "5")),
    ("dgi-busy.txt", ("mig", "-dgi", "-gi", "2")),
    ("dci-all.txt", ("mig", "-dci")),
    ("dgi.txt", ("mig", "-dgi")),
    ("mig-disable.txt", ("-i", "0", "-mig", "0")),
)


def record_mig(branch: int, binary: Path, version: str, out: Path) -> None:
    """MIG_STEPS through NVIDIA's binary on a fresh one-GPU node: each file is what it printed
    (stdout, then stderr), and its exit code on the last line."""
    from conftest import world_readable_node

    out.mkdir(parents=True)
    mounted = world_readable_node(PROFILE.get(branch, "h100"), 1, ("--driver-version", version))
    node = next(mounted)
    env = {k: v for k, v in os.environ.items() if k != "MOKKA_STATE"}
    env["LD_LIBRARY_PATH"] = str(node.mnt / "driver" / "usr" / "lib64")
    for name, args in MIG_STEPS:
        r = subprocess.run([str(binary), *args], capture_output=True, text=True, env=env, timeout=60)
        (out / name).write_text(f"{r.stdout}{r.stderr}{r.returncode}\n")
    try:
        mounted.close()
    except AssertionError as e:  # the refusals asked for are logged as the daemon's warnings
        if not all("control_socket WARNING" in line for line in e.args[0]):
            raise


def main() -> int:
    """--mig: only the mig/ records (the others as they are)."""
    mig_only = "--mig" in sys.argv[1:]
    for branch in [int(a) for a in sys.argv[1:] if a != "--mig"] or BRANCHES:
        if mig_only:
            sys.path.insert(0, str(ROOT / "tests"))
            package = (CACHE / str(branch) / "version").read_text().strip()
            shutil.rmtree(OUT / str(branch) / "mig", ignore_errors=True)
            record_mig(branch, CACHE / str(branch) / "nvidia-smi", package.split()[1].split("-")[0],
                       OUT / str(branch) / "mig")
        else:
            record(branch)
        print(f"recorded {branch} in {OUT / str(branch)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
