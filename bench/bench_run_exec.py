"""A program's start under `mokka run`, and `nvidia-smi` under `mokka env`, each beside a plain
exec. Target: ratio <= 1.1.

`mokka run` and `mokka env` put the driver's libraries and tools in front of LD_LIBRARY_PATH and
PATH, so every program started there searches those directories for its own libraries (libc...)
first (docs/containers.md, "Where consumers load the shims from").

- `/bin/true` is spawned (posix_spawn, waitpid) alternately with the environment `mokka run`
  gave it and with the caller's LD_LIBRARY_PATH and PATH, inside one `mokka run` namespace, so
  the ratio compares the library search only; for reference, with LD_LIBRARY_PATH at the
  mount's driver/usr/lib64 (a search that misses in the FUSE mount).
- `nvidia-smi -L`, found on the PATH `mokka env` prints (its exports applied), vs the package's
  own build (mokkafs/_native/bin/nvidia-smi, LD_LIBRARY_PATH at the built shims); for reference,
  the mount's driver/usr/bin/nvidia-smi.

Medians of alternating runs; on a loaded machine the figures are noisy, the ratios less so.
Usage: python bench/bench_run_exec.py [-n 300] [--smi-n 30] [--profile h100]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _node import BenchNode, report  # noqa: E402

TRUE = "/bin/true"


def _spawn(argv: list[str], env: dict[str, str]) -> float:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        t0 = time.perf_counter()
        pid = os.posix_spawn(argv[0], argv, env, file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 1)])
        _, status = os.waitpid(pid, 0)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(devnull)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv}: exit {os.waitstatus_to_exitcode(status)}")
    return elapsed


def _alternate(argv_by_side: dict[str, tuple[list[str], dict[str, str]]], n: int) -> dict[str, float]:
    """Median seconds per side, the sides run in turn n times (after one warm-up round)."""
    times: dict[str, list[float]] = {side: [] for side in argv_by_side}
    for i in range(n + 1):
        for side, (argv, env) in argv_by_side.items():
            t = _spawn(argv, env)
            if i:
                times[side].append(t)
    return {side: statistics.median(ts) for side, ts in times.items()}


def inner(plain_env: str, mnt: str, n: int) -> None:
    """Runs inside `mokka run`: /bin/true with this environment vs the caller's."""
    under = dict(os.environ)
    plain = dict(under)
    for name, value in json.loads(plain_env).items():
        if value is None:
            plain.pop(name, None)
        else:
            plain[name] = value
    fuse = dict(plain, LD_LIBRARY_PATH=f"{mnt}/driver/usr/lib64")
    med = _alternate({"run": ([TRUE], under), "plain": ([TRUE], plain), "fuse": ([TRUE], fuse)}, n)
    print(json.dumps({**med, "ld_library_path": under.get("LD_LIBRARY_PATH", "")}))


def env_exports(node: BenchNode) -> dict[str, str]:
    """The environment after `eval "$(mokka env --root MNT)"`."""
    script = (f'eval "$({shlex.quote(sys.executable)} -m mokkafs.cli env --root {shlex.quote(str(node.mnt))})" '
              f'&& env -0')
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True, env=node.env).stdout
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def _which(name: str, path: str) -> str:
    for d in path.split(":"):
        candidate = os.path.join(d or ".", name)
        if os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit(f"{name} is not on PATH={path}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=300, help="/bin/true runs per side")
    ap.add_argument("--smi-n", type=int, default=30, help="nvidia-smi -L runs per side")
    ap.add_argument("--profile", default="h100")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    ap.add_argument("--mnt", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        inner(args.inner, args.mnt, args.n)
        return 0
    from mokkafs.render import native

    with BenchNode(args.profile) as node:
        caller = {k: os.environ.get(k) for k in ("LD_LIBRARY_PATH", "PATH")}
        run = [sys.executable, "-m", "mokkafs.cli", "run", "--root", str(node.mnt), "--"]
        res = subprocess.run([*run, sys.executable, __file__, "--inner", json.dumps(caller), "--mnt",
                              str(node.mnt), "-n", str(args.n)], capture_output=True, text=True, check=True,
                             env=node.env)
        t = json.loads(res.stdout.strip().splitlines()[-1])
        env = env_exports(node)
        smi_env = _which("nvidia-smi", env["PATH"])
        package = str(native.LIB_DIR.parent / "bin" / "nvidia-smi")
        plain_env = dict(env, LD_LIBRARY_PATH=str(native.LIB_DIR))
        served = str(node.mnt / "driver" / "usr" / "bin" / "nvidia-smi")
        s = _alternate({"env": ([smi_env, "-L"], env), "package": ([package, "-L"], plain_env),
                        "mount": ([served, "-L"], env)}, args.smi_n)
    print(f"program start under mokka run and nvidia-smi under mokka env, {args.profile} node; "
          f"medians of alternating runs (noisy on a loaded machine)")
    print(f"  {'':34} {'measured':>10} {'plain':>10} {'ratio':>6}  target")
    print(f"  {'/bin/true in mokka run':34} {t['run'] * 1e3:>7.3f} ms {t['plain'] * 1e3:>7.3f} ms "
          f"{t['run'] / t['plain']:>6.2f}  <= 1.1")
    print(f"  {'nvidia-smi -L on mokka env PATH':34} {s['env'] * 1e3:>7.3f} ms {s['package'] * 1e3:>7.3f} ms "
          f"{s['env'] / s['package']:>6.2f}  <= 1.1")
    print(f"  for reference: /bin/true with LD_LIBRARY_PATH at the mount's driver/usr/lib64 "
          f"{t['fuse'] * 1e3:.3f} ms ({t['fuse'] / t['plain']:.2f}x); the mount's nvidia-smi -L "
          f"{s['mount'] * 1e3:.3f} ms ({s['mount'] / s['package']:.2f}x)")
    print(f"  mokka run's LD_LIBRARY_PATH: {t['ld_library_path']}; mokka env's nvidia-smi: {smi_env}")
    report("/bin/true under mokka run, median", t["run"] * 1e3, "ms", floor=t["plain"] * 1e3,
           floor_is="/bin/true with the caller's environment", target=1.1 * t["plain"] * 1e3,
           note="target: 1.1x the floor")
    report("nvidia-smi -L on mokka env's PATH, median", s["env"] * 1e3, "ms", floor=s["package"] * 1e3,
           floor_is="the package's nvidia-smi", target=1.1 * s["package"] * 1e3, note="target: 1.1x the floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
