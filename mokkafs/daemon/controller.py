"""The one place events are applied: validate and apply on the model, persist, tell subscribers.

Every writer (control files, the CLI through them, the Kubernetes agent) goes through
`Controller.apply`, so each event is persisted and published exactly once, in order.
"""
from __future__ import annotations

import copy
import logging

from collections.abc import Callable

from mokkafs.model import Event, Node, Outcome
from mokkafs.daemon.persist import StateDir

# A view told of every applied event: the node after it, and what it did.
Subscriber = Callable[[Node, Outcome], None]


log = logging.getLogger(__name__)


class Controller:
    def __init__(self, node: Node, state: StateDir | None, clock: Callable[[], float]) -> None:
        self.node = node
        self.state = state
        self.clock = clock
        self.subscribers: list[Subscriber] = []
        # Requests the node does not hold (a scenario to run or stop) go to the service that
        # owns them, through the same door as every other command.
        self.handlers: dict[type, Callable[[Event], Outcome]] = {}

    def apply(self, event: Event, note: str | None = None) -> Outcome:
        """Apply one event and return what it did (its reply, its notifications); raises
        InvalidCommand (state untouched) if it does not fit. The caller logs the rejection,
        once. `note` marks it in the event log (its source)."""
        handler = self.handlers.get(type(event))
        if handler is not None:
            return handler(event)
        # Validate (the model refuses before changing anything), persist, then publish: a
        # change no surface has seen yet is rolled back if it cannot be saved, so a full state
        # disk refuses the write (EIO) and leaves the node exactly as it was, on every surface
        # and after a restart. Nothing else runs between apply and save (no await).
        targets = range(len(self.node.gpus)) if event.gpu is None else [event.gpu]
        before = _snapshot(self.node, targets, event.gpu is None) if self.state is not None else None
        outcome = self.node.apply(event, self.clock(), note)
        if self.state is not None:
            try:
                self.state.save_change(self.node, outcome.gpus, outcome.hcas, outcome.log)
            except OSError as e:
                _restore(self.node, before)
                log.error("%s not applied: cannot save the state: %s", type(event).__name__, e.strerror or e)
                raise
        for name in outcome.saturated:
            # Once per counter: it stays at its maximum until a reset clears it.
            log.warning("%s saturated at its maximum; later errors are not counted", name)
        for subscriber in self.subscribers:
            try:
                subscriber(self.node, outcome)
            except Exception:
                # A failing view (a full disk under the mirror, say) must not leave the event
                # applied but unpersisted, nor keep the other views from hearing of it.
                log.exception("subscriber %r failed on %s", subscriber, type(event).__name__)
        return outcome


# What never changes after a node is built (its composition and the facts computed from it) is
# shared by a snapshot, not copied. What can change is copied by hand, as deep as an event can
# reach and no deeper: the snapshot is taken before every event, on the way to the waiters, and
# copy.deepcopy of the same (32 ECC counters keyed by frozen dataclasses per GPU, the composition's
# facts) cost ~0.35 ms an event at 8 GPUs. Records are copied only where the event can change them;
# the log and the MIG views' cache hold immutable entries. An attribute not named here is
# deep-copied, so a new one is rolled back too, only slower.
_FIXED = frozenset({"config", "profile", "identities", "layout", "compute", "features", "nvml_support"})
_SPECIAL = frozenset({"gpus", "hcas"})
_COPY: dict[str, Callable] = {
    "_event0_ns": list,  # of tuples
    "processes": list,  # of tuples
    "process_instances": lambda per_gpu: [dict(d) for d in per_gpu],  # pid -> (gi, ci)
    "accounting": lambda per_gpu: [{pid: copy.copy(r) for pid, r in book.items()} for book in per_gpu],
    "accounting_version": list,
    "gpu_generations": list,
    "unaccounted": lambda per_gpu: [set(s) for s in per_gpu],
    "_mig_views": dict,
    "log": copy.copy,  # a deque of frozen entries
    "injections": dict,
}


def _snapshot(node: Node, gpus, hcas: bool) -> dict:
    snap = {}
    for k, v in vars(node).items():
        if k in _FIXED or k in _SPECIAL:
            continue
        copier = _COPY.get(k)
        snap[k] = v if isinstance(v, (int, float, str, type(None))) else copier(v) if copier else copy.deepcopy(v)
    snap["gpus"] = list(node.gpus)
    snap["_gpu_copies"] = {i: node.gpus[i].copy() for i in gpus}
    snap["hcas"] = [h.copy() for h in node.hcas] if hcas else node.hcas
    return snap


def _restore(node: Node, snap: dict) -> None:
    copies = snap.pop("_gpu_copies")
    for i, g in copies.items():
        snap["gpus"][i] = g
    vars(node).update(snap)
