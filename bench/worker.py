"""CPU worker benchmark: real-time factor and requests per second at concurrency 1 and 4
on a fixed set of spoken clips, and queue behaviour under overload (503s returned,
nothing lost that was accepted)."""

from __future__ import annotations

import concurrent.futures
import time
import wave
from pathlib import Path
from typing import Any

import httpx

from tests.audio import SENTENCES, speak, wer

from .common import PY, RESULTS, Proc, median, say, table, write

PORT = 18750


def clip_seconds(path: Path) -> float:
    with wave.open(str(path)) as w:
        return w.getnframes() / w.getframerate()


def transcribe(url: str, clip: bytes) -> tuple[int, float, str]:
    t = time.perf_counter()
    r = httpx.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                   files={"file": ("c.wav", clip)}, timeout=600)  # fmt: skip
    return (
        r.status_code,
        time.perf_counter() - t,
        r.json().get("text", "") if r.status_code == 200 else "",
    )


def at_concurrency(
    url: str, clips: list[tuple[str, bytes, float]], concurrency: int, rounds: int
) -> dict[str, Any]:
    jobs = [c for _ in range(rounds) for c in clips]
    audio = sum(c[2] for c in jobs)
    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
        results = list(ex.map(lambda c: transcribe(url, c[1]), jobs))
    wall = time.perf_counter() - t
    assert all(code == 200 for code, _, _ in results)
    errors = [wer(c[0], text) for c, (_, _, text) in zip(jobs, results, strict=True)]
    return {"concurrency": concurrency, "requests": len(jobs), "audio_seconds": audio, "wall_seconds": wall,
            "rtf": wall / audio, "requests_per_second": len(jobs) / wall,
            "latency_p50_s": median([r[1] for r in results]), "mean_wer": sum(errors) / len(errors)}  # fmt: skip


def overload(
    url: str, clip: tuple[str, bytes, float], clients: int, max_queue: int
) -> dict[str, Any]:
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        results = list(ex.map(lambda _: transcribe(url, clip[1]), range(clients)))
    accepted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 503]
    correct = [r for r in accepted if wer(clip[0], r[2]) <= 0.25]
    return {"clients": clients, "max_queue": max_queue, "accepted": len(accepted), "refused_503": len(refused),
            "other": len(results) - len(accepted) - len(refused), "accepted_and_correct": len(correct),
            "lost": len(accepted) - len(correct)}  # fmt: skip


def run(quick: bool = False) -> dict[str, Any]:
    audio_dir = RESULTS / "audio"
    clips = []
    for s in SENTENCES:
        path = speak(s, audio_dir)
        clips.append((s, path.read_bytes(), clip_seconds(path)))
    max_queue = 4
    say(f"starting the CPU worker (Whisper tiny.en, max queue {max_queue})")
    w = Proc([PY, "-m", "transcription_worker.main", "--port", str(PORT), "--max-queue", str(max_queue), "--log-level", "warning"],
             f"http://127.0.0.1:{PORT}/health", "cpu-worker")  # fmt: skip
    url = f"http://127.0.0.1:{PORT}"
    try:
        transcribe(url, clips[0][1])  # warm up
        rounds = 1 if quick else 3
        say("concurrency 1 and 4 on the clip set")
        c1 = at_concurrency(url, clips, 1, rounds)
        c4 = at_concurrency(url, clips, 4, rounds)
        say("overload: 16 clients at once against a queue of 4")
        over = overload(url, clips[0], 16, max_queue)
        cpu = w.cpu_seconds()
    finally:
        w.stop()
    result = {"model": "whisper tiny.en (CTranslate2 int8, beam 5)", "clips": len(clips),
              "concurrency_1": c1, "concurrency_4": c4, "overload": over, "worker_cpu_seconds": cpu,
              "targets": {"nothing_accepted_was_lost": over["lost"] == 0 and over["other"] == 0,
                          "overload_answers_503": over["refused_503"] > 0}}  # fmt: skip
    table("CPU worker: real-time factor and throughput", ["concurrency", "requests", "audio s", "wall s", "RTF", "req/s", "p50 s", "WER"],
          [[c["concurrency"], c["requests"], c["audio_seconds"], c["wall_seconds"], c["rtf"], c["requests_per_second"],
            c["latency_p50_s"], c["mean_wer"]] for c in (c1, c4)])  # fmt: skip
    table("CPU worker: overload", list(over), [list(over.values())])
    table("targets", ["target", "met"], [[k, v] for k, v in result["targets"].items()])
    write("worker", result)
    return result
