"""The replica's open realtime sessions: the limit on them, the load they stand for, and
their drain on shutdown.

An open session counts as load on the pool its turns go to (load.py): a session that opens
while that pool is at zero wakes it (KEDA's scaler hears of the demand at once), so that the
first turn is held for a moment, not for a whole cold start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from transcription_api.errors import APIError
from transcription_api.frontend import FrontendLimits


class Sessions:
    def __init__(self, limits: FrontendLimits) -> None:
        self.limits = limits
        self.open: dict[object, str | None] = {}  # each session, and the pool it uses
        self.closing = asyncio.Event()
        self.grace = 0.0
        self.on_demand: Callable[[str], None] = lambda pool: None  # set by load.Load

    def use(self, session: object, pool: str | None) -> None:
        """A session opens, or its settings send its turns to another pool."""
        was = self.open.get(session)
        self.open[session] = pool
        if pool is not None and pool != was:
            self.on_demand(pool)

    def close(self, session: object) -> None:
        self.open.pop(session, None)

    def count(self, pool: str) -> int:
        return sum(1 for p in self.open.values() if p == pool)

    def admit(self) -> tuple[str, APIError | None]:
        """Whether a new session may open here: (the refusal's reason, the refusal)."""
        if self.closing.is_set():
            return "draining", APIError(
                503, "This gateway replica is shutting down; reconnect.", code="draining",
                headers={"Retry-After": "1"},
            )  # fmt: skip
        if len(self.open) >= self.limits.max_realtime_sessions:
            return "limit", APIError(
                503,
                "This gateway replica is at its limit of "
                f"{self.limits.max_realtime_sessions} realtime sessions; retry shortly.",
                code="too_many_sessions", headers={"Retry-After": "1"},
            )  # fmt: skip
        return "", None

    async def drain(self, grace: float) -> None:
        """Shutdown: refuse new sessions; each open one lets its turns end (up to `grace`
        seconds) and is closed with 1001 (endpoint.py)."""
        self.grace = grace
        self.closing.set()
        deadline = time.monotonic() + grace + 1
        while self.open and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
