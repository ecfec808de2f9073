"""Steady load for the scaling and fault tests (e2e/test_scaling.py) and `bench scale`:
clients each sending one transcription after another, and what became of every request.

Each client sends back to back (a closed loop) or, with a `duty` under 1, has a request out
that share of the time: after each answer it waits `pause(seconds, duty)` (half the time: as
long as the request took). The wait follows the answers, so the load is the same share of
what the workers can do on a fast machine and on a slow one.

A request succeeds when it gets a 200 whose transcript is there (for a stream: the final
`transcript.text.done` event, never an `error` event). Anything else is a failure, kept
with its status (0: no HTTP answer at all) and error text.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True)
class Outcome:
    start: float  # time.monotonic()
    end: float
    status: int  # the HTTP status; 0 when no answer came
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Load:
    """`clients` threads sending `audio` to `base_url` (the frontend), until stopped, each
    with a request out `duty` of the time (1: back to back)."""

    base_url: str
    audio: bytes
    clients: int
    stream: bool = False
    timeout: float = 600
    model: str = "whisper-1"
    duty: float = 1.0
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        pause(0.0, self.duty)  # refused here, before any client starts

    def __enter__(self) -> Load:
        self.resize(self.clients)
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop()

    def resize(self, clients: int) -> None:
        """Start more clients (a ramp); fewer is `stop()` and a new Load."""
        while len(self._threads) < clients:
            t = threading.Thread(target=self._client, daemon=True)
            t.start()
            self._threads.append(t)
        self.clients = len(self._threads)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.timeout)

    def _client(self) -> None:
        with httpx.Client(timeout=self.timeout) as http:
            while not self._stop.is_set():
                out = self.one(http)
                with self._lock:
                    self.outcomes.append(out)
                self._stop.wait(pause(out.seconds, self.duty))  # stop() ends it at once

    def one(self, http: httpx.Client) -> Outcome:
        start = time.monotonic()
        data = {"model": self.model}
        if self.stream:
            data["stream"] = "true"
        files = {"file": ("speech.wav", self.audio, "audio/wav")}
        try:
            r = http.post(f"{self.base_url}/v1/audio/transcriptions", data=data, files=files)
        except httpx.HTTPError as e:
            return Outcome(start, time.monotonic(), 0, f"{type(e).__name__}: {e}")
        error = "" if r.status_code == 200 else r.text[:300]
        if r.status_code == 200:
            error = _stream_error(r.text) if self.stream else _json_error(r.text)
        return Outcome(start, time.monotonic(), r.status_code, error)

    def between(self, t0: float, t1: float) -> list[Outcome]:
        """Requests that started in [t0, t1)."""
        with self._lock:
            return [o for o in self.outcomes if t0 <= o.start < t1]

    def wait_for_successes(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if sum(o.ok for o in self.outcomes) >= n:
                    return
            time.sleep(0.2)
        with self._lock:
            outcomes = list(self.outcomes)
        raise AssertionError(
            f"fewer than {n} successful requests within {timeout:.0f}s: {summarize(outcomes)}"
        )


def pause(seconds: float, duty: float) -> float:
    """How long a client waits after a request that took `seconds`, to have one out `duty` of
    the time: 0 at 1 (back to back), as long as it took at 0.5."""
    if not 0 < duty <= 1:
        raise ValueError(f"a load's duty is the share of the time each client has a request "
                         f"out: more than 0 and at most 1, not {duty}")  # fmt: skip
    return seconds * (1 / duty - 1)


def summarize(outcomes: list[Outcome], examples: int = 3) -> str:
    """What the requests so far got, for a failure message: how many of each status (0: no
    answer), and the first errors."""
    counts: dict[int, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    shown = ", ".join(f"{n} x {status}" for status, n in sorted(counts.items())) or "none"
    errors = [f"{o.status}: {o.error}" for o in outcomes if o.error][:examples]
    return f"{len(outcomes)} answered ({shown})" + (f"; first errors: {errors}" if errors else "")


def _json_error(body: str) -> str:
    try:
        text = json.loads(body).get("text")
    except (ValueError, AttributeError):
        return f"not JSON: {body[:200]}"
    return "" if text and text.strip() else "empty transcript"


def _stream_error(body: str) -> str:
    events = [
        json.loads(line[len("data: ") :])
        for line in body.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    if not events:
        return "empty stream"
    last = events[-1]
    if last.get("type") == "transcript.text.done":
        return ""
    return f"stream ended with {json.dumps(last)[:200]}"


def summary(outcomes: list[Outcome], seconds: float) -> dict[str, Any]:
    """Offered and served rates, failures by status and latency, over a window."""
    failures: dict[str, int] = {}
    for o in outcomes:
        if not o.ok:
            key = str(o.status) if o.status else "no answer"
            failures[key] = failures.get(key, 0) + 1
    ok = sorted(o.seconds for o in outcomes if o.ok)
    return {
        "requests": len(outcomes),
        "offered_rps": round(len(outcomes) / seconds, 3) if seconds else 0.0,
        "served_rps": round(len(ok) / seconds, 3) if seconds else 0.0,
        "failures": failures,
        "p50_s": round(statistics.median(ok), 3) if ok else None,
        "p99_s": round(ok[min(len(ok) - 1, int(0.99 * len(ok)))], 3) if ok else None,
    }


def failures(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if not o.ok]
