"""A quiet tenant beside a noisy one, for the fairness benchmark (`python -m bench gateway`):
the quiet tenant's latencies alone and while a noisy tenant keeps many requests waiting for
the same pool, and what the noisy tenant was answered.

The quiet tenant sends one request at a time through the official SDK; the noisy one runs
`clients` loops, each sending its next request as soon as the last is answered (after a
429, a short pause), through httpx, so that its statuses are counted, not raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

NOISY_PAUSE = 0.05  # after a 429, before a noisy loop's next request


@dataclass
class Run:
    """One run: the quiet tenant's latencies (seconds) and the noisy tenant's statuses."""

    quiet: list[float] = field(default_factory=list)
    noisy: Counter[int] = field(default_factory=Counter)
    quiet_after: float | None = None  # seconds of noisy load until the quiet requests ended
    refused_after: float | None = None  # seconds of noisy load until its first 429

    def p(self, q: float) -> float:
        """The quiet tenant's latency at percentile `q`."""
        ordered = sorted(self.quiet)
        return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]

    @property
    def p50(self) -> float:
        return statistics.median(self.quiet)

    def summary(self) -> dict[str, Any]:
        return {
            "quiet_requests": len(self.quiet), "quiet_p50_s": self.p50, "quiet_p99_s": self.p(99),
            "noisy_statuses": {str(k): v for k, v in sorted(self.noisy.items())},
            "quiet_done_after_s": self.quiet_after, "noisy_refused_after_s": self.refused_after,
        }  # fmt: skip


async def quiet(url: str, key: str, audio: bytes, requests: int) -> list[float]:
    """`requests` transcriptions one after another: each one's latency."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    out = []
    for _ in range(requests):
        started = time.perf_counter()
        await client.audio.transcriptions.create(model="whisper-1", file=("q.wav", audio))
        out.append(time.perf_counter() - started)
    await client.close()
    return out


async def alone(url: str, key: str, audio: bytes, requests: int) -> Run:
    return Run(quiet=await quiet(url, key, audio, requests))


async def beside_noisy(
    url: str, *, quiet_key: str, noisy_key: str, quiet_audio: bytes, noisy_audio: bytes,
    requests: int, clients: int, warmup: float = 0.5, until_refused: float = 0.0,
) -> Run:  # fmt: skip
    """The quiet tenant's `requests` while the noisy one's `clients` loops run (started
    `warmup` seconds before, so that the pool's queue has filled); then, for up to
    `until_refused` seconds more, the noisy load alone until it gets a 429."""
    run = Run()
    stop = asyncio.Event()
    refused = asyncio.Event()
    started = time.perf_counter()
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=120, limits=limits) as c:

        async def loop() -> None:
            while not stop.is_set():
                r = await c.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                                 files={"file": ("n.wav", noisy_audio, "audio/wav")},
                                 headers={"authorization": f"Bearer {noisy_key}"})  # fmt: skip
                run.noisy[r.status_code] += 1
                if r.status_code == 429:
                    if not refused.is_set():
                        run.refused_after = time.perf_counter() - started
                        refused.set()
                    await asyncio.sleep(NOISY_PAUSE)

        loops = [asyncio.create_task(loop()) for _ in range(clients)]
        try:
            await asyncio.sleep(warmup)
            run.quiet = await quiet(url, quiet_key, quiet_audio, requests)
            run.quiet_after = time.perf_counter() - started
            if until_refused:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(refused.wait(), until_refused)
        finally:
            stop.set()
            await asyncio.gather(*loops, return_exceptions=True)
    return run
