"""Gateway benchmark (`python -m bench gateway`): many models and tenants behind one
frontend, side by side in one run. Each part is a function of its own that returns its
results and prints its table; `run` puts them in one JSON (bench-results/gateway.json).

- fairness: a quiet tenant's latency (p50, p99) alone, and beside a noisy tenant at many
  times its load on the same pool, with weighted fair queuing (tenants declared) and
  without (no tenants: first come, first served). The pool: two stand-in worker processes
  whose time is their audio's (`SERVICE` seconds per second of it), each sent at most
  `BOUND` requests at once; the noisy tenant has a quota, and its 429s once past it are
  counted.

Target: the quiet tenant's p50 beside the noisy one within 1.5x of its p50 alone, with fair
queuing.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from testkit.audio import tone_wav
from testkit.fairness import Run, alone, beside_noisy

from .common import PY, RESULTS, Proc, frontend_proc, say, table, write

BASE = 18820
NAMES = ["whisper-large-v3", "whisper-1"]
SERVICE = 0.2  # seconds a worker takes per second of audio
BOUND = 2  # requests one worker is sent at once
QUIET, NOISY = tone_wav(1.0), tone_wav(0.5)
TARGET = 1.5


def worker(port: int, per_audio_second: float = 0.0) -> Proc:
    return Proc([PY, "-m", "bench.standin_server", "--port", str(port),
                 "--per-audio-second", str(per_audio_second)],
                f"http://127.0.0.1:{port}/health", f"gateway-standin-{port}")  # fmt: skip


def one_pool(path: Path, urls: list[str], bound: int | None = None) -> Path:
    """A route table of one deployment with one pool on these workers."""
    pool = {"name": "batch", "engine": "vllm", "mode": "continuous", "service": "batch",
            "endpoints": urls, "max_in_flight_per_replica": bound}  # fmt: skip
    path.write_text(json.dumps({"model": NAMES[0], "aliases": NAMES[1:], "pools": [pool]}))
    return path


def fairness(quick: bool = False) -> dict[str, Any]:
    """The quiet tenant alone, beside the noisy one with fair queuing, and without."""
    requests, clients = (20, 16) if quick else (100, 16)
    workers = [worker(BASE + 1 + i, SERVICE) for i in range(2)]
    urls = [f"http://127.0.0.1:{BASE + 1 + i}" for i in range(2)]
    routes = one_pool(RESULTS / "gateway-fairness-routes.json", urls, BOUND)
    keys = RESULTS / "gateway-fairness-keys"
    # Its quota lasts the quiet tenant's requests beside it (answers of 1 s, ~35 a second).
    quota = 400 if quick else 900
    tenants = [{"name": "quiet"},
               {"name": "noisy", "quota": {"audio_seconds_per_minute": quota}}]  # fmt: skip
    load: dict[str, Any] = {"quiet_key": "sk-quiet", "noisy_key": "sk-noisy", "quiet_audio": QUIET,
                            "noisy_audio": NOISY, "requests": requests, "clients": clients}  # fmt: skip
    url = f"http://127.0.0.1:{BASE}"
    try:
        keys.write_text("sk-quiet group=quiet\nsk-noisy group=noisy\n")
        fe = frontend_proc(routes, BASE, "gateway-fair", api_keys_path=keys, tenants=tenants)
        try:
            say(f"fairness: the quiet tenant alone ({requests} requests, one at a time)")
            by_itself = asyncio.run(alone(url, "sk-quiet", QUIET, requests))
            say(f"fairness: beside {clients} noisy loops, with fair queuing")
            fair = asyncio.run(beside_noisy(url, **load, until_refused=60))
        finally:
            fe.stop()
        keys.write_text("sk-quiet\nsk-noisy\n")
        fe = frontend_proc(routes, BASE, "gateway-fifo", api_keys_path=keys)
        try:
            say(f"fairness: beside {clients} noisy loops, first come first served (no tenants)")
            fifo = asyncio.run(beside_noisy(url, **load))
        finally:
            fe.stop()
    finally:
        for w in workers:
            w.stop()
    runs = {"alone": by_itself, "fair_queuing": fair, "first_come_first_served": fifo}
    result: dict[str, Any] = {
        "service_seconds_per_audio_second": SERVICE, "max_in_flight_per_replica": BOUND,
        "workers": len(workers), "noisy_clients": clients, "noisy_quota_per_minute": quota,
        **{name: r.summary() for name, r in runs.items()},
        "ratio_fair": fair.p50 / by_itself.p50, "ratio_fifo": fifo.p50 / by_itself.p50,
    }  # fmt: skip
    table("fairness: the quiet tenant's latency (ms), 1 s of audio per request",
          ["quiet tenant", "p50", "p99", "p50 / alone", "noisy: 200", "noisy: 429"],
          [_row(name, r, by_itself) for name, r in runs.items()])  # fmt: skip
    return result


def _row(name: str, r: Run, by_itself: Run) -> list[Any]:
    return [name.replace("_", " "), r.p50 * 1000, r.p(99) * 1000, r.p50 / by_itself.p50,
            r.noisy.get(200, "-"), r.noisy.get(429, "-")]  # fmt: skip


def run(quick: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"fairness": fairness(quick)}
    result["targets"] = {
        f"quiet_p50_within_{TARGET}x_with_fair_queuing": result["fairness"]["ratio_fair"] <= TARGET,
    }
    table("targets", ["target", "met"], [[k, v] for k, v in result["targets"].items()])
    write("gateway", result)
    return result
