"""The daemon's one clock: the model's time (wall-time seconds) and every sleep of the daemon's
ticks come from it, so trio's `MockClock` can drive a whole daemon through an hour in a test.

A clock is called for the time now, and `await clock.sleep(s)` sleeps on trio's clock. The
model takes time as an argument (`now`) and never reads a clock of its own.
"""
from __future__ import annotations

import time
from typing import Protocol

import trio


class Clock(Protocol):
    def __call__(self) -> float:
        """Seconds since the epoch, now: what the model, its log and the state file are stamped with."""

    async def sleep(self, seconds: float) -> None:
        """Sleep on trio's clock (which a test may replace by a `trio.testing.MockClock`)."""


class TrioClock:
    """Wall time as trio measures it: `epoch` (the host's time when made) plus the seconds trio's
    clock has advanced since. The daemon's clock: its time never steps back when the host's
    clock does (energy counters only grow), and under a `MockClock` it is virtual, like every
    sleep and timeout in the daemon. Made inside `trio.run`."""

    def __init__(self, epoch: float | None = None) -> None:
        self._origin = trio.current_time()
        self.epoch = time.time() if epoch is None else epoch

    def __call__(self) -> float:
        return self.epoch + (trio.current_time() - self._origin)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


class WallClock:
    """The host's clock (`time.time`); for components used outside a daemon's trio run."""

    def __call__(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)
