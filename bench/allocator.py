"""The faster-whisper worker with its allocator setting (transcription_worker/allocator.py)
and with glibc's defaults, side by side.

Two workers (Whisper tiny.en, the same settings) take the same espeak-ng clips in
interleaved rounds, one request at a time and four at once. For each: its CPU time per
request (user and kernel, from /proc: robust to other load on the machine), the page faults
per request, the median latency, and its peak memory (VmHWM). The second worker runs with
`MALLOC_PERTURB_=0`, glibc's own default: a `MALLOC_*` variable in the environment makes
the worker leave glibc's settings alone.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

from testkit import host
from testkit.audio import SENTENCES, speak

from .common import PY, RESULTS, Proc, median, say, table, write
from .worker import Clip, clip_seconds, transcribe

PORT = 18760
CONCURRENCY = (1, 4)
WORKERS = {"kept large blocks (the worker's default)": {},
           "glibc's defaults (MALLOC_PERTURB_=0)": {"MALLOC_PERTURB_": "0"}}  # fmt: skip


def run(quick: bool = False) -> dict[str, Any]:
    clip_set: list[Clip] = []
    for s in SENTENCES:
        path = speak(s, RESULTS / "audio")
        clip_set.append((s, path.read_bytes(), clip_seconds(path)))
    rounds = 1 if quick else 3
    say(f"{len(clip_set)} clips, {rounds} round(s) at concurrency {CONCURRENCY}, two workers")
    procs = {}
    try:
        for i, (name, env) in enumerate(WORKERS.items()):
            port = PORT + i
            procs[name] = (Proc([PY, "-m", "transcription_worker.main", "--port", str(port),
                                 "--log-level", "warning"], f"http://127.0.0.1:{port}/health",
                                f"allocator-{i}", env=env), f"http://127.0.0.1:{port}")  # fmt: skip
        for proc, url in procs.values():
            transcribe(url, clip_set[0][1])  # warm up: the model's first run
            proc.reset_peak()
        runs: dict[str, list[dict[str, float]]] = {n: [] for n in procs}
        for r in range(rounds):
            for name, (proc, url) in procs.items():
                say(f"round {r + 1}/{rounds}: {name}")
                for c in CONCURRENCY:
                    cpu, pf, t = (
                        proc.cpu_seconds(),
                        host.page_faults(proc.proc.pid),
                        time.perf_counter(),
                    )
                    with concurrent.futures.ThreadPoolExecutor(c) as ex:
                        got = list(ex.map(transcribe, [url] * len(clip_set),
                                          [clip[1] for clip in clip_set]))  # fmt: skip
                    assert all(code == 200 for code, _, _ in got), [g[0] for g in got]
                    runs[name].append({"concurrency": c, "requests": len(got),
                                       "cpu": proc.cpu_seconds() - cpu,
                                       "faults": host.page_faults(proc.proc.pid) - pf,
                                       "wall": time.perf_counter() - t,
                                       "latency": median([g[1] for g in got])})  # fmt: skip
        peaks = {name: proc.peak_kib() / 1024 for name, (proc, _) in procs.items()}
    finally:
        for proc, _ in procs.values():
            proc.stop()
    rows = []
    for name, rs in runs.items():
        n = sum(x["requests"] for x in rs)
        rows.append({"name": name, "requests": n,
                     "cpu_seconds_per_request": sum(x["cpu"] for x in rs) / n,
                     "page_faults_per_request": sum(x["faults"] for x in rs) / n,
                     "latency_p50_s": median([x["latency"] for x in rs]),
                     "requests_per_second": n / sum(x["wall"] for x in rs),
                     "peak_mib": peaks[name]})  # fmt: skip
    kept, glibc = rows
    result = {"clips": len(clip_set), "rounds": rounds, "concurrency": CONCURRENCY, "rows": rows,
              "cpu_ratio": kept["cpu_seconds_per_request"] / glibc["cpu_seconds_per_request"],
              "peak_ratio": kept["peak_mib"] / glibc["peak_mib"]}  # fmt: skip
    table("the faster-whisper worker's allocator (same clips, interleaved rounds)",
          ["", "requests", "CPU s/req", "faults/req", "p50 s", "req/s", "peak MiB"],
          [[r["name"], r["requests"], r["cpu_seconds_per_request"], round(r["page_faults_per_request"]),
            r["latency_p50_s"], r["requests_per_second"], round(r["peak_mib"])] for r in rows])  # fmt: skip
    table(
        "ratios, kept / glibc's",
        ["CPU per request", "peak memory"],
        [[result["cpu_ratio"], result["peak_ratio"]]],
    )
    write("allocator", result)
    return result
