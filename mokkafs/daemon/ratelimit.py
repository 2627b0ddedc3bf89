"""Rate-limited log lines for refusals: the first of a kind is logged, its repeats are counted
and summarised once. Pure (time is an argument) and bounded (a cap on the kinds remembered)."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

WINDOW_S = 10.0
MAX_KEYS = 1024


@dataclass(frozen=True)
class Summary:
    """`count` more refusals like the one logged for `key` came in the `seconds` after it."""

    key: Hashable
    count: int
    seconds: float

    def line(self) -> str:
        return f"and {self.count} more like it in the last {self.seconds:.0f} s"


@dataclass
class _Window:
    start: float
    repeats: int = 0


class RateLimiter:
    """One window per key: `hit` says whether this one should be logged, and returns the
    summaries that are due (the key's previous window, or one evicted to stay under the cap)."""

    def __init__(self, window_s: float = WINDOW_S, max_keys: int = MAX_KEYS) -> None:
        if window_s <= 0 or max_keys < 1:
            raise ValueError("window_s must be positive and max_keys at least 1")
        self.window_s = window_s
        self.max_keys = max_keys
        # Ordered by window start, oldest first: the windows that ended are always at the front.
        self._windows: OrderedDict[Hashable, _Window] = OrderedDict()

    def __len__(self) -> int:
        return len(self._windows)

    def hit(self, key: Hashable, now: float) -> tuple[bool, list[Summary]]:
        due = self.flush(now)
        window = self._windows.get(key)
        if window is not None:
            window.repeats += 1
            return False, due
        if len(self._windows) >= self.max_keys:
            # Every remembered window is still open: close the oldest early, with what it
            # counted so far, rather than grow or drop the count.
            old_key, old = self._windows.popitem(last=False)
            if old.repeats:
                due.append(Summary(old_key, old.repeats, now - old.start))
        self._windows[key] = _Window(now)
        return True, due

    def flush(self, now: float, everything: bool = False) -> list[Summary]:
        """Close the windows that ended by `now` (all of them with `everything`, at shutdown)."""
        due = []
        while self._windows:
            key, window = next(iter(self._windows.items()))
            if not everything and now - window.start < self.window_s:
                break
            del self._windows[key]
            if window.repeats:
                due.append(Summary(key, window.repeats, min(now - window.start, self.window_s)))
        return due


class RefusalLog:
    """A limiter read on a clock, handing each summary that comes due to `summarise` (which
    writes its line): what every edge that refuses callers (FUSE ops, the control socket) needs."""

    def __init__(self, clock: Callable[[], float], summarise: Callable[[Summary], None],
                 limiter: RateLimiter | None = None) -> None:
        self.clock = clock
        self.summarise = summarise
        self.limiter = limiter or RateLimiter()

    def first(self, key: Hashable) -> bool:
        """True if a refusal of kind `key` should log its line now; summarises what is due."""
        first, due = self.limiter.hit(key, self.clock())
        for summary in due:
            self.summarise(summary)
        return first

    def flush(self, everything: bool = False) -> None:
        """Summarise the windows that ended (all of them with `everything`, at shutdown)."""
        for summary in self.limiter.flush(self.clock(), everything):
            self.summarise(summary)
