#!/usr/bin/env python3
"""The agent's own share of annotation-to-fault latency: from the watch event that carries a
`mokkafs.io/inject` annotation being read off the API server's stream to the control write done,
for a setting (`gpu=0 power_limit=...`, the control socket) and a control-file write
(`gpu=0 temperature=...`, through FUSE), each beside its floor: the same write made bare, with
no agent. Prints p50/p90/p99 in ms, and what the share is made of: deciding (parse, check on a
scratch node), the claim (a conditional PATCH of the Node: one API round trip) and the write.
Target: a few ms, the claim's round trip included.

    python bench/bench_agent.py [--n 200] [--profile h100] [--gpus 8]       # the fake API server
    python bench/bench_agent.py --kubeconfig FILE --node NAME [--api URL]  # a real one

Without --kubeconfig and --api, it starts tests/k8s_fake.py in a process of its own. Against a real API
server, --node names a Node no mokkafs agent watches (the bench runs its own, on a node it
mounts here; two agents would race for the annotation): `kubectl create -f` a bare Node object
will do. --api overrides the server of the kubeconfig (or, alone, is a plain-HTTP server).
What happens before the event is read (the annotation's PATCH, the API server's watch fan-out)
is the API server's share, and after the write the node's (NVML readers see it within
bench/bench_setters.py's numbers).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _node import BenchNode, percentile, report  # noqa: E402

GPU = 0
WARMUP = 10

# The fake API server in a process of its own, as a real one is: in this one it would take the
# agent's interpreter lock from it. It prints its URL and serves until its stdin closes.
FAKE = r"""
import sys
sys.path.insert(0, sys.argv[1])
from k8s_fake import FakeCluster
cluster = FakeCluster(sys.argv[2])
url = cluster.start()
cluster.server.handle_error = lambda *a: None  # a client hanging up mid-watch is not news here
print(url, flush=True)
sys.stdin.read()
cluster.stop()
"""


class Marks:
    """perf_counter() times the agent's thread leaves here: the last watch line read, the last
    claim PATCH's start and end, the last control write's start and end."""

    def __init__(self) -> None:
        self.line = self.patch_start = self.patch_end = self.write_start = 0.0
        self.done: list[tuple[float, float, float, float, float]] = []  # one per write
        self.wrote = threading.Event()
        self.reconciled = threading.Event()  # a reconcile returned: the agent's after-work is done


def instrument(marks: Marks):
    """Wrap, without changing the agent: the watch's line reader (the moment an event is
    received), the API's patch_node (the claim, timed_api), the tree's write (the control write)
    and the reconcile (to know when the agent is idle again). Returns the tree and agent classes."""
    import kubernetes.watch.watch as kwatch

    from mokkafs.agent import watch

    read_lines = kwatch.iter_resp_lines

    def timed_lines(resp, *a, **kw):
        for line in read_lines(resp, *a, **kw):
            marks.line = time.perf_counter()
            yield line

    kwatch.iter_resp_lines = timed_lines  # the agent imports it at each watch

    class TimedTree(watch.MountedTree):
        def write(self, command) -> None:
            marks.write_start = time.perf_counter()
            super().write(command)
            end = time.perf_counter()
            marks.done.append((marks.line, marks.patch_start, marks.patch_end, marks.write_start, end))
            marks.wrote.set()

    class TimedAgent(watch.Agent):
        def reconcile(self, node: dict) -> None:
            super().reconcile(node)
            marks.reconciled.set()

    return TimedTree, TimedAgent


def timed_api(api, marks: Marks):
    patch_node = api.patch_node

    def patch(*a, **kw):
        marks.patch_start = time.perf_counter()
        try:
            return patch_node(*a, **kw)
        finally:
            marks.patch_end = time.perf_counter()

    api.patch_node = patch
    return api


def core_api(kubeconfig: str | None, server: str | None):
    from kubernetes import client, config

    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(kubeconfig, client_configuration=cfg)
    if server:
        cfg.host = server
    cfg.proxy = None
    return client.CoreV1Api(client.ApiClient(cfg))


def floors(node: BenchNode, settings: list[str], n: int) -> dict[str, list[float]]:
    """The same two writes bare: each setting sent to the control socket as the agent sends it
    (`settings`, alternating), and one write() to gpu0/temperature (opened once: the agent opens
    it per write, which its share includes)."""
    from mokkafs.cli.control_client import send
    from mokkafs.daemon.control_protocol import control_path

    sock = control_path(node.state / "state")
    out: dict[str, list[float]] = {"socket": [], "file": []}
    fd = os.open(node.mnt / f"gpu{GPU}" / "temperature", os.O_WRONLY)
    try:
        for k in range(WARMUP + n):
            t0 = time.perf_counter()
            reply = send(sock, settings[k % 2])
            t1 = time.perf_counter()
            assert reply.ok, reply
            os.write(fd, f"{60 + k % 2}\n".encode())
            t2 = time.perf_counter()
            if k >= WARMUP:
                out["socket"].append((t1 - t0) * 1e3)
                out["file"].append((t2 - t1) * 1e3)
    finally:
        os.close(fd)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="injections of each kind (after 10 to warm up)")
    ap.add_argument("--profile", default="h100")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--api", metavar="URL", help="the API server (default: a fake one in this process)")
    ap.add_argument("--kubeconfig", help="credentials (and server) of a real API server")
    ap.add_argument("--node", default="gpu-node-1", help="the Node to annotate (a real cluster: one no agent watches)")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for one injection")
    args = ap.parse_args()

    from mokkafs.agent import decisions, grammar
    from mokkafs.model import compose
    from mokkafs.model.profiles import load_profile

    marks = Marks()
    tree_class, agent_class = instrument(marks)
    fake = None
    server = args.api
    if server is None and args.kubeconfig is None:
        fake = subprocess.Popen([sys.executable, "-c", FAKE, str(ROOT / "tests"), args.node], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        server = fake.stdout.readline().strip()
    where = server or f"the server of {args.kubeconfig}"
    power = load_profile(args.profile).power
    lo, hi = power.min_limit_w, power.max_limit_w
    watts = (f"{lo + (hi - lo) / 4:g}", f"{lo + (hi - lo) / 2:g}")
    kinds = {"socket": lambda k: f"gpu={GPU} power_limit={watts[k % 2]}",
             "file": lambda k: f"gpu={GPU} temperature={60 + k % 2}"}
    config = compose(load_profile(args.profile), gpus=args.gpus)
    settings = [str(grammar.parse_injection(kinds["socket"](k), config)[0].command) for k in range(2)]
    annotator = core_api(args.kubeconfig, server)  # the user's kubectl
    share: dict[str, list[tuple[float, ...]]] = {"socket": [], "file": []}
    with BenchNode(args.profile, args.gpus) as node:
        node.settle()
        agent = agent_class(timed_api(core_api(args.kubeconfig, server), marks), args.node,
                            tree_class(str(node.mnt), state_dir=str(node.state)), resync_s=300)
        runner = threading.Thread(target=agent.run, daemon=True)
        runner.start()
        try:
            for k in range(WARMUP + args.n):  # interleaved: both under the same conditions
                for kind, value in kinds.items():
                    marks.wrote.clear()
                    body = {"metadata": {"annotations": {decisions.ANNOTATION_INJECT: value(k)}}}
                    annotator.patch_node(args.node, body, _content_type="application/merge-patch+json",
                                         _preload_content=False)
                    wait = args.timeout if k else args.timeout + 30  # the first: the agent's start too
                    if not marks.wrote.wait(wait):
                        raise RuntimeError(f"{value(k)!r} on {args.node} at {where}: not written within {wait:g} s")
                    # The agent's after-work (reading the Node again, the health report, the
                    # Event, the watch events of its own PATCHes) is not its share of this
                    # latency: let it finish before the next annotation.
                    marks.reconciled.clear()
                    while marks.reconciled.wait(0.05):
                        marks.reconciled.clear()
                    if k >= WARMUP:
                        share[kind].append(marks.done[-1])
        finally:
            agent.stopping = True
            for value in ("stop", None):  # an event ends the agent's watch now, not at its timeout
                annotator.patch_node(args.node, {"metadata": {"annotations": {"mokkafs.io/bench": value}}},
                                     _content_type="application/merge-patch+json", _preload_content=False)
            runner.join(timeout=args.timeout)
        floor = floors(node, settings, args.n)
    if fake is not None:
        fake.stdin.close()
        fake.wait(10)

    load = os.getloadavg()[0]
    print(f"# {args.gpus} x {args.profile}, API server {where}{' (tests/k8s_fake.py)' if fake else ''}, "
          f"{args.n} injections of each kind, interleaved, {os.cpu_count()} CPUs, load {load:.2f}; ms")
    print(f"{'':<46} {'p50':>8} {'p90':>8} {'p99':>8}")

    def row(name: str, values: list[float]) -> None:
        print(f"{name:<46} {percentile(values, .5):8.3f} {percentile(values, .9):8.3f} {percentile(values, .99):8.3f}")

    for kind, title, floor_name in (("socket", "setting (control socket)", "send"),
                                    ("file", "control file (through FUSE)", "write()")):
        got = share[kind]
        print(title)
        row("  agent: watch event -> control write done", [(w1 - line) * 1e3 for line, _, _, _, w1 in got])
        row("    decide (event -> claim sent)", [(p0 - line) * 1e3 for line, p0, _, _, _ in got])
        row("    claim (PATCH round trip)", [(p1 - p0) * 1e3 for _, p0, p1, _, _ in got])
        row(f"    write (the agent's {floor_name})", [(w1 - w0) * 1e3 for _, _, _, w0, w1 in got])
        row(f"  floor: a bare {floor_name}", floor[kind])
        share_p50 = percentile([(w1 - line) * 1e3 for line, _, _, _, w1 in got], .5)
        print(f"  agent share / floor, p50: {share_p50 / percentile(floor[kind], .5):.1f}x")
        report(f"agent: watch event -> {title} written, p50", share_p50, "ms", floor=percentile(floor[kind], .5),
               floor_is=f"a bare {floor_name}", note="target: a few ms")
    print("target: event -> write done within a few ms, the claim's round trip included")
    return 0


if __name__ == "__main__":
    sys.exit(main())
