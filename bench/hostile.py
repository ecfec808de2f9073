"""Hostile-client benchmark (issue 25): the frontend's peak resident memory under 100
hostile connections at once, with its default limits, while good requests keep coming.

The frontend process runs as the pod runs it (`transcription-frontend`, default limits,
a stand-in vLLM worker behind it). For `seconds` (40; 15 with --quick), 100 connections
at once, each reopened as soon as the gateway cuts it off:
- 34 send an endless header (64 KiB at a time; a 20 MB header took 25 MB each before),
- 33 send headers one byte a second (slow loris),
- 33 declare a 20 MB upload and send its body at 100 bytes/s;
and a good 0.5 s transcription is sent every 0.25 s. Reported: RSS before and at peak
(VmHWM and 10 ms samples), how the hostile connections were answered, and how many good
requests were served and how fast. Target: the peak stays under the frontend's default
memory limit (512 MiB) and every good request is served.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from testkit.audio import tone_wav

from .common import RESULTS, Proc, frontend_proc, pct, say, table, write
from .frontend import routes, worker

BASE = 18760
LIMIT_MIB = 512  # spec.frontend.resources' default memory limit
CONNECTIONS = 100


def frontend(port: int, route_file: Path) -> Proc:
    return frontend_proc(route_file, port, f"hostile-frontend-{port}")


def _status(data: bytes) -> str:
    parts = data.split(b" ", 2)
    return parts[1].decode() if len(parts) > 1 and data.startswith(b"HTTP/") else "closed"


def _attack(kind: str, port: int, stop: threading.Event, outcomes: Counter[str]) -> None:
    upload = (b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 20000000\r\n\r\n"
              b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF')  # fmt: skip
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.settimeout(0.05)
                if kind == "header":
                    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Junk: ")
                    chunk, pause = b"a" * 65536, 0.0
                elif kind == "loris":
                    s.sendall(b"GET /v1/models HTTP/1.1\r\n")
                    chunk, pause = b"x", 1.0
                else:
                    s.sendall(upload)
                    chunk, pause = b"\x00" * 100, 1.0
                data = b""
                while not stop.is_set():
                    try:
                        s.sendall(chunk)
                    except OSError:
                        break
                    try:
                        got = s.recv(65536)
                        if not got:
                            break
                        data += got
                    except TimeoutError:
                        pass
                    stop.wait(pause)
                if not stop.is_set():
                    try:
                        s.settimeout(2)
                        data += s.recv(65536)
                    except OSError:
                        pass
                    outcomes[f"{kind}: {_status(data)}"] += 1
        except OSError:
            outcomes[f"{kind}: refused"] += 1
            stop.wait(0.1)


def run(quick: bool = False) -> dict[str, Any]:
    seconds = 15.0 if quick else 40.0
    procs: list[Proc] = []
    try:
        say("starting a stand-in worker and the frontend (default limits)")
        w = worker(BASE + 1)
        procs.append(w)
        rf = routes(RESULTS / "routes-hostile.json", {"batch": [f"http://127.0.0.1:{BASE + 1}"]})
        fe = frontend(BASE, rf)
        procs.append(fe)
        url = f"http://127.0.0.1:{BASE}"
        wav = tone_wav(0.5)
        with httpx.Client(timeout=30) as c:  # warm
            c.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                   files={"file": ("a.wav", wav)})  # fmt: skip
        before = fe.rss_kib()
        fe.reset_peak()
        stop = threading.Event()
        outcomes: Counter[str] = Counter()
        samples = [before]

        def sample() -> None:
            while not stop.is_set():
                samples.append(fe.rss_kib())
                time.sleep(0.01)

        kinds = ["header", "loris", "body"]
        threads = [threading.Thread(target=_attack, args=(kinds[i % 3], BASE, stop, outcomes))
                   for i in range(CONNECTIONS)]  # fmt: skip
        threads.append(threading.Thread(target=sample))
        say(f"{CONNECTIONS} hostile connections for {seconds:g}s, a good request every 0.25 s")
        for t in threads:
            t.start()
        good: list[float] = []
        failed: Counter[str] = Counter()
        deadline = time.monotonic() + seconds
        with httpx.Client(timeout=30) as c:
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                try:
                    r = c.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                               files={"file": ("a.wav", wav)})  # fmt: skip
                    if r.status_code == 200:
                        good.append(time.perf_counter() - t0)
                    else:
                        failed[str(r.status_code)] += 1
                except httpx.HTTPError as e:
                    failed[type(e).__name__] += 1
                time.sleep(0.25)
        stop.set()
        for t in threads:
            t.join(timeout=10)
        peak = max(max(samples), fe.peak_kib())
        after = fe.rss_kib()
    finally:
        for p in procs:
            p.stop()
    result = {
        "connections": CONNECTIONS,
        "seconds": seconds,
        "rss_before_mib": before / 1024,
        "rss_peak_mib": peak / 1024,
        "rss_after_mib": after / 1024,
        "hostile_outcomes": dict(sorted(outcomes.items())),
        "good_served": len(good),
        "good_failed": dict(failed),
        "good_p50_ms": pct(good, 50) * 1000 if good else None,
        "good_p99_ms": pct(good, 99) * 1000 if good else None,
        "targets": {
            f"peak_under_{LIMIT_MIB}mib": peak / 1024 < LIMIT_MIB,
            "every_good_request_served": bool(good) and not failed,
        },
    }
    table(f"Frontend under {CONNECTIONS} hostile connections ({seconds:g}s, default limits)",
          ["RSS before MiB", "peak MiB", "after MiB", "good served", "good failed", "good p50 ms", "good p99 ms"],
          [[result["rss_before_mib"], result["rss_peak_mib"], result["rss_after_mib"], len(good),
            sum(failed.values()), result["good_p50_ms"], result["good_p99_ms"]]])  # fmt: skip
    table("How the hostile connections were answered", ["connection: answer", "count"],
          [[k, v] for k, v in result["hostile_outcomes"].items()])  # fmt: skip
    write("hostile", result)
    return result
