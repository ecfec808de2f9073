"""The replica's open realtime sessions: the limit on them, and their drain on shutdown."""

from __future__ import annotations

import asyncio
import time

from transcription_api.errors import APIError

from ..limits import Limits


class Sessions:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open: set[object] = set()
        self.closing = asyncio.Event()
        self.grace = 0.0

    def admit(self) -> tuple[str, APIError | None]:
        """Whether a new session may open here: (the refusal's reason, the refusal)."""
        if self.closing.is_set():
            return "draining", APIError(
                503, "This gateway replica is shutting down; reconnect.", code="draining",
                headers={"Retry-After": "1"},
            )  # fmt: skip
        if len(self.open) >= self.limits.max_sessions:
            return "limit", APIError(
                503,
                f"This gateway replica is at its limit of {self.limits.max_sessions} realtime "
                "sessions; retry shortly.",
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
