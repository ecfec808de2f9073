"""Gateway benchmark (`python -m bench gateway`): many models and tenants behind one
frontend, side by side in one run. Each part is a function of its own that returns its
results and prints its table; `run` puts them in one JSON (bench-results/gateway.json).

- added latency: the latency a gateway adds against a deployment's own frontend. The same
  stand-in worker process behind two frontends: a deployment's own (a one-deployment route
  table) and a gateway's (`Routes` of two deployments), requests alternating between them
  so both see the same noise; p50/p99 of each and of the difference, for `json` and for a
  stream's time to its last event.
- routing cost: the same 20 MB WAV through the gateway with the form's `model` before the
  file (routed before it is read, streamed on) and after it (spooled, then routed): p50
  time, and how far the frontend process's resident memory peaked above where it was.
- fairness: a quiet tenant's latency (p50, p99) alone, and beside a noisy tenant at many
  times its load on the same pool, with weighted fair queuing (tenants declared) and
  without (no tenants: first come, first served). The pool: two stand-in worker processes
  whose time is their audio's (`SERVICE` seconds per second of it), each sent at most
  `BOUND` requests at once; the noisy tenant has a quota, and its 429s once past it are
  counted.

Targets: the gateway adds under 1 ms at p50 (json and stream); the quiet tenant's p50 beside
the noisy one within 1.5x of its p50 alone, with fair queuing.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from testkit.audio import tone_wav
from testkit.fairness import Run, alone, beside_noisy
from transcription_api.capabilities import Engine, Mode
from transcription_api.frontend import ChunkingSpec
from transcription_api.routes import PoolRoute, Routes, RouteTable
from transcription_frontend.audio.encode import wav

from .common import PY, RESULTS, Proc, frontend_proc, median, say, table, write
from .frontend import first_event, paired, post

BASE = 18820
NAMES = ["whisper-large-v3", "whisper-1"]  # the names the stand-in worker answers to
OTHER = ["distil-large-v3", "distil"]  # a second deployment's, in the gateway's routes
SERVICE = 0.2  # seconds a worker takes per second of audio
BOUND = 2  # requests one worker is sent at once
QUIET, NOISY = tone_wav(1.0), tone_wav(0.5)
TARGET = 1.5
ADDED_TARGET_MS = 1.0
BIG = 20 * 1024 * 1024  # the routing cost's upload: 20 MiB of WAV, 11 minutes of silence


def worker(port: int, per_audio_second: float = 0.0) -> Proc:
    return Proc([PY, "-m", "bench.standin_server", "--port", str(port),
                 "--per-audio-second", str(per_audio_second)],
                f"http://127.0.0.1:{port}/health", f"gateway-standin-{port}")  # fmt: skip


def deployment(urls: list[str], bound: int | None = None, names: list[str] = NAMES,
               name: str | None = None) -> RouteTable:  # fmt: skip
    """A route table of one deployment with one pool on these workers; with `name`, as a
    gateway's routes carry it (its pool named `<name>/batch`)."""
    pool = PoolRoute(name=f"{name}/batch" if name else "batch", engine=Engine.VLLM,
                     mode=Mode.CONTINUOUS, service="batch", endpoints=urls,
                     max_in_flight_per_replica=bound)  # fmt: skip
    return RouteTable(model=names[0], aliases=names[1:], pools=[pool],
                      deployment=f"bench/{name}" if name else None)  # fmt: skip


def routes_file(path: Path, routes: RouteTable | Routes) -> Path:
    path.write_text(routes.dumps())
    return path


def gateway_routes(url: str) -> Path:
    """A gateway's routes: the stand-in's deployment and a second one (on the same worker,
    never asked: the table only has to hold more than one deployment)."""
    two = [deployment([url], name="whisper"), deployment([url], names=OTHER, name="distil")]
    return routes_file(RESULTS / "gateway-routes.json", Routes(deployments=two))


def added_latency(quick: bool = False) -> dict[str, Any]:
    """A deployment's own frontend and a gateway's on one worker, requests alternating."""
    n = 50 if quick else 200
    url = f"http://127.0.0.1:{BASE + 10}"
    procs = [worker(BASE + 10)]
    try:
        own_routes = routes_file(RESULTS / "gateway-own-routes.json", deployment([url]))
        procs.append(frontend_proc(own_routes, BASE + 11, "gateway-own-frontend"))
        procs.append(frontend_proc(gateway_routes(url), BASE + 12, "gateway-frontend"))
        own, via = f"http://127.0.0.1:{BASE + 11}", f"http://127.0.0.1:{BASE + 12}"
        posted = partial(post, audio=tone_wav(0.5))  # 16 KB
        streamed = partial(first_event, audio=tone_wav(0.5), last=True)
        both = ("own", "gateway")
        say(f"added latency: {n} requests per path and frontend, alternating (after a warm-up)")
        json_ = paired(own, via, n, posted, posted, labels=both)
        last = paired(own, via, n, streamed, streamed, labels=both)
    finally:
        for p in reversed(procs):
            p.stop()
    result = {"json": json_, "stream_last_event": last}
    table("added latency: a gateway (2 deployments) against a deployment's own frontend (ms)",
          ["path", "requests", "own p50", "own p99", "gateway p50", "gateway p99",
           "added p50", "added p99"],
          [[label, r["requests"], r["own_p50_ms"], r["own_p99_ms"], r["gateway_p50_ms"],
            r["gateway_p99_ms"], r["added_p50_ms"], r["added_p99_ms"]]
           for label, r in (("json", json_), ("stream, last event", last))])  # fmt: skip
    return result


def ordered(client: httpx.Client, url: str, audio: bytes, order: str) -> float:
    """Seconds to transcribe `audio` (json), the form's `model` before or after the file."""
    parts: list[tuple[str, Any]] = [("model", (None, NAMES[1])),
                                    ("file", ("a.wav", audio, "audio/wav"))]  # fmt: skip
    if order == "after":
        parts.reverse()
    t = time.perf_counter()
    r = client.post(f"{url}/v1/audio/transcriptions", files=parts)
    assert r.status_code == 200, r.text
    return time.perf_counter() - t


def routing_cost(quick: bool = False) -> dict[str, Any]:
    """A 20 MB WAV through the gateway with `model` before and after it, alternating: time,
    and the frontend's peak resident memory above where it was, per upload."""
    n = 2 if quick else 5
    url = f"http://127.0.0.1:{BASE + 20}"
    procs = [worker(BASE + 20)]
    big = wav(bytes(BIG - 44), 16000)
    seconds: dict[str, list[float]] = {"before": [], "after": []}
    growth: dict[str, list[int]] = {"before": [], "after": []}
    try:
        # Sent whole, not cut into chunks: what is measured is the upload's way through.
        fe = frontend_proc(gateway_routes(url), BASE + 21, "gateway-routing",
                           chunking=ChunkingSpec(enabled=False))  # fmt: skip
        procs.append(fe)
        via = f"http://127.0.0.1:{BASE + 21}"
        say(f"routing cost: {n} uploads of 20 MiB each with `model` before and after the file")
        with httpx.Client(timeout=120) as c:
            for order in seconds:  # warm up: every code path loaded once
                ordered(c, via, big, order)
            for _ in range(n):
                for order in seconds:
                    took, before, peak = fe.peak_during(lambda o=order: ordered(c, via, big, o))
                    seconds[order].append(took)
                    growth[order].append(peak - before)
    finally:
        for p in reversed(procs):
            p.stop()
    result = {order: {"uploads": n, "file_bytes": len(big), "p50_ms": median(seconds[order]) * 1000,
                      "peak_rss_growth_kib": growth[order],
                      "peak_rss_growth_max_mib": max(growth[order]) / 1024}
              for order in seconds}  # fmt: skip
    table("routing cost: a 20 MiB WAV through the gateway (json)",
          ["`model`", "uploads", "p50 ms", "peak RSS growth, max MiB"],
          [[f"{order} the file", r["uploads"], r["p50_ms"], r["peak_rss_growth_max_mib"]]
           for order, r in result.items()])  # fmt: skip
    return result


def fairness(quick: bool = False) -> dict[str, Any]:
    """The quiet tenant alone, beside the noisy one with fair queuing, and without."""
    requests, clients = (20, 16) if quick else (100, 16)
    workers = [worker(BASE + 1 + i, SERVICE) for i in range(2)]
    urls = [f"http://127.0.0.1:{BASE + 1 + i}" for i in range(2)]
    routes = routes_file(RESULTS / "gateway-fairness-routes.json", deployment(urls, BOUND))
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
    result: dict[str, Any] = {
        "added_latency": added_latency(quick),
        "routing_cost": routing_cost(quick),
        "fairness": fairness(quick),
    }
    added = result["added_latency"]
    result["targets"] = {
        f"json_added_p50_under_{ADDED_TARGET_MS:g}ms": added["json"]["added_p50_ms"]
        < ADDED_TARGET_MS,
        f"stream_added_p50_under_{ADDED_TARGET_MS:g}ms": added["stream_last_event"]["added_p50_ms"]
        < ADDED_TARGET_MS,
        f"quiet_p50_within_{TARGET}x_with_fair_queuing": result["fairness"]["ratio_fair"] <= TARGET,
    }
    table("targets", ["target", "met"], [[k, v] for k, v in result["targets"].items()])
    write("gateway", result)
    return result
