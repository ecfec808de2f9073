"""Choosing the faster-whisper pool defaults: WER and throughput of each setting, together.

The batching engine in-process (no HTTP), on the clip set of `bench worker` (sentences
tiny.en gets right and ones it gets wrong), at concurrency 1 and 8, in interleaved rounds:
beam size 1 or 5, VAD filter off or on, and on the CPU one batch at a time on every core or
one batch per core. Reports req/s, CPU seconds per request (robust to
other load on the machine) and WER (easy, hard).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

from testkit.audio import SENTENCES, wer

from .common import say, table, write
from .worker import Clip, clips

CONFIGS: list[dict[str, Any]] = [
    {"beam_size": 5, "vad_filter": False, "max_batch_size": 8, "workers": 1},
    {"beam_size": 1, "vad_filter": False, "max_batch_size": 8, "workers": 1},
    {"beam_size": 5, "vad_filter": True, "max_batch_size": 8, "workers": 1},
    {"beam_size": 5, "vad_filter": False, "max_batch_size": 8, "workers": 2},
]


def name(c: dict[str, Any]) -> str:
    return (f"beam {c['beam_size']}, vad {'on' if c['vad_filter'] else 'off'}, "
            f"batch {c['max_batch_size']}, {c['workers']} batch(es) at once")  # fmt: skip


async def serve(
    lane: Any, clip_set: list[Clip], concurrency: int
) -> tuple[float, float, list[float], list[tuple[str, float]]]:
    import io

    from transcription_worker.batcher import Job
    from transcription_worker.transcriber import Options, decode

    audio = [decode(io.BytesIO(c[1])) for c in clip_set]
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(a: Any) -> str:
        async with gate:
            t = time.perf_counter()
            job = Job(a, Options())
            lane.submit(job)
            text = []
            while True:
                kind, value = await job.events.get()
                if kind == "segment":
                    text.append(value.text)
                elif kind == "error":
                    raise value
                elif kind == "done":
                    latencies.append(time.perf_counter() - t)
                    return "".join(text)

    t, c = time.perf_counter(), time.process_time()
    texts = await asyncio.gather(*[one(a) for a in audio])
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    return (
        wall,
        cpu,
        latencies,
        [(s[0], wer(s[0], x)) for s, x in zip(clip_set, texts, strict=True)],
    )


def run(quick: bool = False) -> dict[str, Any]:
    from transcription_worker.batcher import Lane
    from transcription_worker.main import default_model
    from transcription_worker.transcriber import Transcriber

    clip_set = clips()
    rounds = 1 if quick else 2
    cpus = len(os.sched_getaffinity(0))
    say(f"{len(CONFIGS)} settings x concurrency 1 and 8, {rounds} round(s), {cpus} CPUs")
    engines = [Transcriber(default_model(), threads=cpus, **c) for c in CONFIGS]
    runs: dict[tuple[int, int], list[Any]] = {}

    async def rounds_() -> None:
        for r in range(rounds):
            for i, (cfg, engine) in enumerate(zip(CONFIGS, engines, strict=True)):
                for conc in (1, 8):
                    say(f"round {r + 1}/{rounds}: {name(cfg)}, concurrency {conc}")
                    lane = Lane(engine, max_queue=64)
                    lane.start()
                    res = await serve(lane, clip_set, conc)
                    runs.setdefault((i, conc), []).append(res)
                    await lane.stop()
                    say(f"  {len(res[2]) / res[0]:.3f} req/s, {res[1] / len(res[2]):.2f} CPU s/req, "
                        f"WER {statistics.mean(e for _, e in res[3]):.3f}")  # fmt: skip

    asyncio.run(rounds_())
    rows = []
    for (i, conc), rs in sorted(runs.items()):
        n = sum(len(r[2]) for r in rs)
        errors = [e for r in rs for e in r[3]]
        rows.append({"settings": name(CONFIGS[i]), **CONFIGS[i], "concurrency": conc,
                     "requests_per_second": n / sum(r[0] for r in rs),
                     "cpu_seconds_per_request": sum(r[1] for r in rs) / n,
                     "latency_p50_s": statistics.median(x for r in rs for x in r[2]),
                     "wer_easy": statistics.mean(e for s, e in errors if s in SENTENCES),
                     "wer_hard": statistics.mean(e for s, e in errors if s not in SENTENCES)})  # fmt: skip
    table("faster-whisper settings: throughput and WER together (in-process engine)",
          ["settings", "conc", "req/s", "CPU s/req", "p50 s", "WER easy", "WER hard"],
          [[r["settings"], r["concurrency"], r["requests_per_second"], r["cpu_seconds_per_request"],
            r["latency_p50_s"], r["wer_easy"], r["wer_hard"]] for r in rows])  # fmt: skip
    result = {"clips": len(clip_set), "rounds": rounds, "cpus": cpus, "rows": rows}
    write("worker-settings", result)
    return result
