"""At most one log line per key (a client's address) per interval, so a client that sends bad
requests in a loop cannot fill the log (docs/kafka-api.md, "Limits and security")."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["OncePerKey"]


class OncePerKey:
    """Decides which events of each key are logged: the first, then the first after each
    `interval_s` since the last one logged; it counts the ones held back so the next line can
    say how many. Remembers at most `max_keys` keys (the longest unlogged go first), so many
    clients cannot grow it without bound. Thread-safe."""

    def __init__(self, interval_s: float, *, clock: Callable[[], float],
                 max_keys: int = 4096) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.interval_s = interval_s
        self._clock = clock
        self._max_keys = max_keys
        self._lock = threading.Lock()
        #: key -> [when last logged, events held back since]; oldest logged first
        self._keys: OrderedDict[str, list[float]] = OrderedDict()

    def admit(self, key: str) -> int | None:
        """None: do not log this event of `key`. Otherwise log it, and this many of `key`'s
        events were held back since its last line."""
        now = self._clock()
        with self._lock:
            entry = self._keys.get(key)
            if entry is not None and now - entry[0] < self.interval_s:
                entry[1] += 1
                return None
            held = int(entry[1]) if entry is not None else 0
            self._keys[key] = [now, 0]
            self._keys.move_to_end(key)
            while len(self._keys) > self._max_keys:
                self._keys.popitem(last=False)
            return held
