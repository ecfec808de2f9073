"""A work queue with the semantics of client-go's: deduplicated keys, one worker per key
at a time, a key that changes while being processed is processed again afterwards, and
per-key exponential backoff for failures."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Hashable
from typing import Generic, TypeVar

BASE_DELAY = 0.5
MAX_DELAY = 300.0
K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._pending: set[K] = set()
        self._active: set[K] = set()
        self._dirty: set[K] = set()
        self._delayed: dict[Hashable, asyncio.TimerHandle] = {}
        self._failures: Counter[K] = Counter()

    @property
    def depth(self) -> int:
        return len(self._pending)

    def add(self, key: K, delay: float = 0.0) -> None:
        if delay > 0:
            handle = self._delayed.get(key)
            loop = asyncio.get_running_loop()
            when = loop.time() + delay
            if handle is not None and handle.when() <= when:
                return  # an earlier wake-up is already scheduled
            if handle is not None:
                handle.cancel()
            self._delayed[key] = loop.call_at(when, self._wake, key)
            return
        if key in self._pending:
            return
        if key in self._active:
            self._dirty.add(key)
            return
        self._pending.add(key)
        self._queue.put_nowait(key)

    def _wake(self, key: K) -> None:
        self._delayed.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        key = await self._queue.get()
        self._pending.discard(key)
        self._active.add(key)
        return key

    def done(self, key: K) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def retry(self, key: K) -> float:
        """Schedule a retry after a failure; returns the delay."""
        delay = min(BASE_DELAY * 2.0 ** self._failures[key], MAX_DELAY)
        self._failures[key] += 1
        self.add(key, delay=delay)
        return delay

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)
