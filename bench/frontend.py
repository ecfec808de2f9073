"""Frontend benchmark, everything side by side in one process tree:

(a) added latency (p50, p99) of the gateway against calling the same stand-in vLLM worker
    directly, requests interleaved so both see the same noise, on each real path:
    - json passed through (16 KB upload),
    - srt rendered by the gateway (the worker is asked for verbose_json),
    - a stream's time to its first delta (the gateway translates vLLM's chunks),
    - a 20 MB upload streamed through (json);
    and throughput with 8 clients;
(b) peak resident memory the gateway adds while 8 clients upload 25 MB files at once;
(c) throughput with two workers of unequal speed: least-in-flight against round-robin.

Targets: p50 added latency < 1 ms for json, < 2 ms for srt and a stream's first delta;
8 x 25 MB add < 64 MiB; least-in-flight beats round-robin.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from testkit.audio import tone_wav

from .common import PY, RESULTS, Proc, frontend_proc, pct, say, table, write

BASE = 18700
NAMES = ["whisper-large-v3", "whisper-1"]


def routes(path: Path, pools: dict[str, list[str]]) -> Path:
    table_ = {
        "model": NAMES[0],
        "aliases": NAMES[1:],
        "max_upload_bytes": 26_214_400,
        "pools": [
            {"name": n, "engine": "vllm", "mode": "continuous", "service": n, "endpoints": urls}
            for n, urls in pools.items()
        ],
    }
    path.write_text(json.dumps(table_))
    return path


def worker(port: int, delay: float = 0.0) -> Proc:
    return Proc([PY, "-m", "bench.standin_server", "--port", str(port), "--delay", str(delay),
                 "--chunk-delay", "0"], f"http://127.0.0.1:{port}/health", f"standin-{port}")  # fmt: skip


def frontend(port: int, route_file: Path, balancer: str = "least-in-flight") -> Proc:
    return frontend_proc(route_file, port, f"frontend-{port}", balancer=balancer)


def post(client: httpx.Client, url: str, audio: bytes, fmt: str = "json") -> float:
    """Seconds until the whole answer has arrived."""
    t = time.perf_counter()
    r = client.post(
        f"{url}/v1/audio/transcriptions",
        data={"model": "whisper-1", "response_format": fmt},
        files={"file": ("a.wav", audio)},
    )
    assert r.status_code == 200, r.text
    return time.perf_counter() - t


def first_event(client: httpx.Client, url: str, audio: bytes, last: bool = False) -> float:
    """Seconds until a stream's first event has arrived (the stream is then read to its end);
    `last`: until its last has."""
    t, first = time.perf_counter(), None
    with client.stream("POST", f"{url}/v1/audio/transcriptions",
                       data={"model": "whisper-1", "stream": "true"},
                       files={"file": ("a.wav", audio)}) as r:  # fmt: skip
        assert r.status_code == 200
        for chunk in r.iter_bytes():
            if first is None and b"data:" in chunk:
                first = time.perf_counter() - t
    assert first is not None
    return time.perf_counter() - t if last else first


Timed = Callable[[httpx.Client, str], float]


def paired(direct: str, via: str, n: int, on_direct: Timed, on_via: Timed,
           labels: tuple[str, str] = ("direct", "frontend")) -> dict[str, Any]:  # fmt: skip
    """The same request direct and through the gateway (or on any two paths, named by
    `labels`), interleaved: p50/p99 of each and of the difference."""
    d, v = [], []
    with httpx.Client(timeout=120) as c:
        for _ in range(min(50, n)):  # warm up both paths
            on_direct(c, direct), on_via(c, via)
        for _ in range(n):
            d.append(on_direct(c, direct))
            v.append(on_via(c, via))
    added = sorted(b - a for a, b in zip(d, v, strict=True))
    return {
        "requests": n,
        f"{labels[0]}_p50_ms": pct(d, 50) * 1000,
        f"{labels[0]}_p99_ms": pct(d, 99) * 1000,
        f"{labels[1]}_p50_ms": pct(v, 50) * 1000,
        f"{labels[1]}_p99_ms": pct(v, 99) * 1000,
        "added_p50_ms": pct(added, 50) * 1000,
        "added_p99_ms": pct(added, 99) * 1000,
    }


def latency(direct: str, via: str, n: int) -> dict[str, dict[str, Any]]:
    small = tone_wav(0.5)  # 16 KB
    big = b"RIFF" + b"\x00" * (20_000_000 - 4)
    return {
        "json": paired(direct, via, n, lambda c, u: post(c, u, small), lambda c, u: post(c, u, small)),
        # vLLM renders no srt: the gateway asks it for verbose_json and renders srt itself.
        "srt": paired(direct, via, n, lambda c, u: post(c, u, small, "verbose_json"),
                      lambda c, u: post(c, u, small, "srt")),
        "stream_first_delta": paired(direct, via, n, lambda c, u: first_event(c, u, small),
                                     lambda c, u: first_event(c, u, small)),
        "upload_20mb": paired(direct, via, max(10, n // 40), lambda c, u: post(c, u, big),
                              lambda c, u: post(c, u, big)),
    }  # fmt: skip


def throughput(url: str, seconds: float, concurrency: int) -> float:
    audio = tone_wav(0.5)
    deadline = time.monotonic() + seconds

    def loop() -> int:
        done = 0
        with httpx.Client(timeout=30) as c:
            while time.monotonic() < deadline:
                post(c, url, audio)
                done += 1
        return done

    with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
        total = sum(ex.map(lambda _: loop(), range(concurrency)))
    return total / seconds


def upload_memory(fe: Proc, url: str, clients: int = 8, size: int = 25_000_000) -> dict[str, Any]:
    big = b"RIFF" + b"\x00" * (size - 4)
    before = fe.rss_kib()
    fe.reset_peak()
    stop, samples = False, [before]

    def sample() -> None:
        while not stop:
            samples.append(fe.rss_kib())
            time.sleep(0.01)

    def upload(_: int) -> int:
        with httpx.Client(timeout=120) as c:
            return c.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                          files={"file": ("big.wav", big)}).status_code  # fmt: skip

    with concurrent.futures.ThreadPoolExecutor(clients + 1) as ex:
        sampler = ex.submit(sample)
        codes = list(ex.map(upload, range(clients)))
        stop = True
        sampler.result()
    peak = max(max(samples), fe.peak_kib())
    return {"clients": clients, "file_bytes": size, "statuses": sorted(set(codes)),
            "rss_before_mib": before / 1024, "rss_peak_mib": peak / 1024,
            "added_mib": (peak - before) / 1024}  # fmt: skip


def unequal(route_file: Path, fe_port: int, balancer: str, seconds: float) -> float:
    """Requests per second completed by 8 clients in a fixed time window."""
    fe = frontend(fe_port, route_file, balancer)
    try:
        url = f"http://127.0.0.1:{fe_port}"
        with httpx.Client(timeout=60) as c:
            post(c, url, tone_wav(0.5))
        return throughput(url, seconds, 8)
    finally:
        fe.stop()


def run(quick: bool = False) -> dict[str, Any]:
    n = 200 if quick else 1000
    procs: list[Proc] = []
    try:
        say("starting a stand-in worker and the frontend")
        w = worker(BASE + 1)
        procs.append(w)
        fe = frontend(
            BASE, routes(RESULTS / "routes-a.json", {"batch": [f"http://127.0.0.1:{BASE + 1}"]})
        )
        procs.append(fe)
        direct, via = f"http://127.0.0.1:{BASE + 1}", f"http://127.0.0.1:{BASE}"
        say(f"(a) {n} interleaved requests per path, direct vs through the frontend")
        lat = latency(direct, via, n)
        rps = {"direct_c8": throughput(direct, 5, 8), "frontend_c8": throughput(via, 5, 8)}
        say("(b) 8 concurrent 25 MB uploads through the frontend")
        mem = upload_memory(fe, via)
        for p in procs:
            p.stop()
        procs = []

        say("(c) unequal workers (50 ms and 250 ms per request): least-in-flight vs round-robin")
        procs += [worker(BASE + 2, 0.05), worker(BASE + 3, 0.25)]
        rf = routes(
            RESULTS / "routes-c.json",
            {"batch": [f"http://127.0.0.1:{BASE + 2}", f"http://127.0.0.1:{BASE + 3}"]},
        )
        window = 5.0 if quick else 15.0
        lif = unequal(rf, BASE + 4, "least-in-flight", window)
        rr = unequal(rf, BASE + 5, "round-robin", window)
    finally:
        for p in procs:
            p.stop()
    result = {
        "latency": lat,
        "requests_per_second": rps,
        "upload_memory": mem,
        "unequal_workers": {
            "window_seconds": window,
            "least_in_flight_rps": lif,
            "round_robin_rps": rr,
            "ratio": lif / rr,
        },
        "targets": {
            "json_added_p50_under_1ms": lat["json"]["added_p50_ms"] < 1.0,
            "srt_added_p50_under_2ms": lat["srt"]["added_p50_ms"] < 2.0,
            "stream_first_delta_added_p50_under_2ms": lat["stream_first_delta"]["added_p50_ms"]
            < 2.0,
            "uploads_add_under_64mib": mem["added_mib"] < 64,
            "least_in_flight_beats_round_robin": lif > rr,
        },
    }
    rows = []
    for name, label in (("json", "json, passed through"), ("srt", "srt, rendered"),
                        ("stream_first_delta", "stream, first delta"), ("upload_20mb", "20 MB upload, json")):  # fmt: skip
        x = lat[name]
        rows.append([label, x["requests"], x["direct_p50_ms"], x["frontend_p50_ms"],
                     x["added_p50_ms"], x["added_p99_ms"]])  # fmt: skip
    table("(a) latency added by the frontend (ms; interleaved with direct calls)",
          ["path", "requests", "direct p50", "frontend p50", "added p50", "added p99"], rows)  # fmt: skip
    table("(a) throughput, 8 clients, json", ["path", "req/s"],
          [["direct to worker", rps["direct_c8"]], ["through frontend", rps["frontend_c8"]]])  # fmt: skip
    table("(b) frontend memory, 8 x 25 MB concurrent uploads", ["RSS before MiB", "peak MiB", "added MiB", "statuses"],
          [[mem["rss_before_mib"], mem["rss_peak_mib"], mem["added_mib"], mem["statuses"]]])  # fmt: skip
    table("(c) unequal workers, 8 clients", ["policy", "req/s"],
          [["least-in-flight", lif], ["round-robin", rr], ["ratio", lif / rr]])  # fmt: skip
    table("targets", ["target", "met"], [[k, v] for k, v in result["targets"].items()])
    write("frontend", result)
    return result
