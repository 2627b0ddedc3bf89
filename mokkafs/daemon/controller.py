"""The one place events are applied: validate and apply on the model, persist, tell subscribers.

Every writer (control files, the CLI through them, the Kubernetes agent) goes through
`Controller.apply`, so each event is persisted and published exactly once, in order.
"""
from __future__ import annotations

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
        outcome = self.node.apply(event, self.clock(), note)
        for name in outcome.saturated:
            # Once per counter: it stays at its maximum until a reset clears it.
            log.warning("%s saturated at its maximum; later errors are not counted", name)
        # Subscribers first: a blocked nvmlEventSetWait wakes as soon as the event is in the
        # shared state; the write that caused it still returns only once it is persisted.
        for subscriber in self.subscribers:
            try:
                subscriber(self.node, outcome)
            except Exception:
                # A failing view (a full disk under the mirror, say) must not leave the event
                # applied but unpersisted, nor keep the other views from hearing of it.
                log.exception("subscriber %r failed on %s", subscriber, type(event).__name__)
        if self.state is not None:
            for i in outcome.gpus:
                self.state.save_gpu(self.node, i)
            if outcome.hcas:  # node-level events (node reset, InfiniBand ports) touch the HCAs
                self.state.save_hcas(self.node)
            self.state.append_log(self.node, outcome.log)
        return outcome
