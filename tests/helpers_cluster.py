"""The cluster tier's handle on a real single-node Kubernetes (scripts/cluster.py): kubectl against
its API server, objects applied from YAML, waits that name the step that did not happen."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = REPO / "scripts" / "cluster.py"


class StepFailed(AssertionError):
    """A step of an end-to-end check did not happen; the message names it and what was seen."""


class Cluster:
    def __init__(self, desc: dict) -> None:
        self.desc = desc
        self.node = desc["node"]
        self.dir = Path(desc["dir"])
        self.images = desc["images"]

    @classmethod
    def up(cls, d: Path) -> "Cluster":
        r = subprocess.run([sys.executable, str(CLUSTER_SCRIPT), "up", "--dir", str(d)],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            subprocess.run([sys.executable, str(CLUSTER_SCRIPT), "down", "--dir", str(d)],
                           capture_output=True, timeout=300)
            raise StepFailed(f"step 'cluster up' failed (exit {r.returncode}): {r.stderr.strip()[-2000:]}")
        return cls(json.loads(r.stdout))

    def down(self) -> None:
        subprocess.run([sys.executable, str(CLUSTER_SCRIPT), "down", "--dir", str(self.dir)],
                       capture_output=True, timeout=300)

    # -- kubectl --------------------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess:
        r = subprocess.run([self.desc["kubectl"], "--kubeconfig", self.desc["kubeconfig"], *args],
                           input=input, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise StepFailed(f"kubectl {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
        return r

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, objects: list[dict] | str) -> None:
        text = objects if isinstance(objects, str) else yaml.safe_dump_all(objects)
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=text)

    def delete(self, objects: list[dict] | str, wait: bool = True) -> None:
        text = objects if isinstance(objects, str) else yaml.safe_dump_all(objects)
        self.kubectl("delete", "--ignore-not-found", f"--wait={str(wait).lower()}", "--timeout=90s",
                     "-f", "-", input=text, timeout=120)

    def node_obj(self) -> dict:
        return self.get("node", self.node)

    def allocatable(self, resource: str) -> int:
        return int(self.node_obj()["status"].get("allocatable", {}).get(resource, "0"))

    def condition(self, type_: str) -> dict | None:
        for c in self.node_obj()["status"].get("conditions", []):
            if c["type"] == type_:
                return c
        return None

    def pod(self, name: str, namespace: str = "default") -> dict:
        return self.get("pod", name, "-n", namespace)

    def logs(self, name: str, namespace: str = "default", container: str | None = None) -> str:
        args = ["logs", name, "-n", namespace] + (["-c", container] if container else [])
        return self.kubectl(*args).stdout

    def events(self, name: str, namespace: str = "default") -> list[dict]:
        out = self.get("events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")
        return out["items"]

    # -- waiting --------------------------------------------------------------------------------

    def step(self, what: str, predicate, timeout: float = 120, interval: float = 0.25, show=None):
        """Wait for `predicate()` to be true; fail naming the step and (show()) what was seen."""
        deadline = time.monotonic() + timeout
        last_error = None
        while True:
            try:
                value = predicate()
                if value:
                    return value
            except (StepFailed, subprocess.TimeoutExpired, KeyError, ValueError) as e:
                last_error = e
            if time.monotonic() > deadline:
                seen = ""
                if show is not None:
                    try:
                        seen = show()
                    except Exception as e:  # the evidence is best effort; the failure is the step
                        seen = f"(could not show: {e})"
                raise StepFailed(f"step '{what}' did not happen in {timeout:.0f} s"
                                 + (f"; last error: {last_error}" if last_error else "")
                                 + (f"\n{seen}" if seen else ""))
            time.sleep(interval)

    def pod_phase(self, name: str, namespace: str = "default") -> str:
        return self.pod(name, namespace)["status"].get("phase", "")

    def describe(self, kind: str, name: str, namespace: str = "default") -> str:
        return self.kubectl("describe", kind, name, "-n", namespace, check=False).stdout[-4000:]

    def wait_pod(self, name: str, phase: str, namespace: str = "default", timeout: float = 120) -> dict:
        def done():
            p = self.pod(name, namespace)
            if p["status"].get("phase") == "Failed" and phase != "Failed":
                raise StepFailed(f"pod {namespace}/{name} Failed: {self.describe('pod', name, namespace)}")
            return p if p["status"].get("phase") == phase else None
        return self.step(f"pod {namespace}/{name} {phase}", done, timeout,
                         show=lambda: self.describe("pod", name, namespace))

    def restart_pods(self, namespace: str, app: str, check: bool = True) -> None:
        """Delete the pods labelled app.kubernetes.io/name=`app` and wait until they are gone: their
        DaemonSet starts new ones, as a restart of the program does."""
        self.kubectl("delete", "pod", "-n", namespace, "-l", f"app.kubernetes.io/name={app}", "--wait=true",
                     "--timeout=90s", timeout=120, check=check)

    def rollout(self, kind: str, name: str, namespace: str, timeout: float = 180) -> None:
        r = self.kubectl("rollout", "status", f"{kind}/{name}", "-n", namespace, f"--timeout={int(timeout)}s",
                         check=False, timeout=timeout + 30)
        if r.returncode != 0:
            pods = self.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
            first = self.kubectl("get", "pods", "-n", namespace, "-o", "name", check=False).stdout.split()
            detail = self.kubectl("describe", first[0], "-n", namespace, check=False).stdout[-3000:] if first else ""
            logs = self.kubectl("logs", first[0], "-n", namespace, "--all-containers", "--tail=30",
                                check=False).stdout if first else ""
            raise StepFailed(f"step 'rollout of {kind} {namespace}/{name}' failed: {r.stderr.strip()}\n"
                             f"{pods}\n{detail}\n{logs}")
