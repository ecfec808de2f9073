"""Long-audio benchmark (issue 21): one long request cut on silence and fanned out across
worker replicas, against the same request decoded whole by one replica, on local processes
(the real frontend and the real CPU worker, `transcription_worker.main`: faster-whisper,
Whisper tiny.en, continuous batching), not on the test bed's real node.

The audio: a long espeak-ng recording (`testkit.longaudio.long_recording`: SENTENCES and
HARD_SENTENCES shuffled and repeated, 0.3-1.5 s pauses), 600 s (120 s with --quick). Each
worker replica runs with the same CPU share: `--threads 1` (and OMP_NUM_THREADS=1).

1. wall time of one request (OpenAI SDK, json):
   (a) 1 replica, whole: the frontend runs with `chunking.enabled` false and the request sets no
       `chunking_strategy`: the worker decodes the whole file itself (1 thread);
   (c) 1 replica, chunked (`chunking_strategy="auto"`): chunking's own cost, without
       parallelism;
   (b) 2 replicas, chunked (`chunking_strategy="auto"`, 2 x 1 thread); and again with each
       chunk prompted with the text of the one before it in its run
       (`chunking.previous_text`), side by side.
   Target: (a) / (b) >= 1.8. Also the CPU seconds the workers (each replica's) and the
   frontend used: robust to other load on the machine, whose CPU count and load average are
   printed with the table.
2. WER of each against the bare engine decoding the whole file: faster-whisper's
   `WhisperModel.transcribe` in this process on the worker's model (tiny.en, int8, beam 5,
   1 thread), with its default `condition_on_previous_text=True`. Target: (b) <= bare + 0.5
   points.
3. time to the first streamed delta (stream=true, chunked, 2 replicas), against one chunk's
   time: the chunk latency of that request's own chunks (the frontend's
   `transcription_frontend_chunk_duration_seconds` histogram, before and after: the exact
   mean, and the median interpolated in its buckets), and, for comparison, a lone ~25 s
   excerpt of the recording sent as a request of its own (median of 3); and what the gateway
   does before its first chunk (decode, Silero VAD, cuts), timed in this process on the same
   file. Every delta's arrival is recorded. Target: first delta < the chunks' mean latency
   + 1 s.
4. p50 latency of a short request (a 3-5 s sentence, sequentially, one started every ~1 s)
   with no other load, and while a long request (as (b)) runs; same frontend, 2 replicas.
   Reported with their ratio (no target).
5. peak frontend RSS added while it handles a 1-hour MP3 upload (20 minutes with --quick;
   the recording as a 48 kbit/s MP3, looped by ffmpeg's -stream_loop, packets copied),
   chunked (`"auto"`), against a fast stand-in vLLM worker (bench/standin_server.py, recorded
   answers) so that the hour is not an hour of decoding. RSS is read from /proc (VmRSS every
   10 ms, and VmHWM reset before) after a warm-up that chunked the recording once (Silero
   and libav loaded). Target: < 150 MiB added.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx
import openai

from testkit.audio import HARD_SENTENCES, SENTENCES, speak, tone_wav, wer
from testkit.longaudio import Recording, excerpt, long_recording, looped
from transcription_api.capabilities import Engine, Mode
from transcription_api.frontend import ChunkingSpec
from transcription_api.routes import PoolRoute, RouteTable

from .common import PY, RESULTS, Proc, frontend_proc, median, pct, say, table, write
from .frontend import routes as standin_routes
from .frontend import worker as standin_worker
from .worker import clip_seconds

FRONTEND_ONE, FRONTEND_TWO, FRONTEND_STANDIN = 18780, 18781, 18782
FRONTEND_CHAINED = 18787  # 2 replicas, chunks prompted with the text before them
WORKERS = (18783, 18784)
STANDIN = 18785
THREADS = 1  # per worker replica: its equal CPU share
BEAM_SIZE = 5  # the worker's default
PAUSES = (0.3, 1.5)  # seconds of silence between sentences
EXCERPT_SECONDS = 25.0  # a lone chunk's worth (max 30 s, target 25 s)
SHORT_PERIOD = 1.0  # seconds from one short request's start to the next
SHORT_BASELINE = 20  # short requests with no other load (10 with --quick)
SPEEDUP_TARGET = 1.8
WER_POINTS = 0.5
FIRST_DELTA_SLACK_S = 1.0
MEMORY_TARGET_MIB = 150.0
MP3_BITRATE = "48k"  # an hour: 21.6 MB, under the route table's 25 MiB upload limit
CHUNK_METRIC = "transcription_frontend_chunk_duration_seconds"
CHUNKS_METRIC = "transcription_frontend_chunks_per_request"
WHERE = "local processes on this machine (not the test bed's real node)"
NAN = float("nan")


class Measured(Protocol):
    """What a request's CPU is read from: a local process, or a pod's cgroup."""

    def cpu_seconds(self) -> float: ...


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=3600)


def scrape(url: str) -> dict[str, float]:
    """The frontend's /metrics: each sample line's name and labels -> its value."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' histogram_quantile: linear within the bucket the rank falls in."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return NAN
    rank, lower, below = q * total, 0.0, 0.0
    for le, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * (rank - below) / max(cumulative - below, 1e-9)
        lower, below = le, cumulative
    return lower


def histogram(before: dict[str, float], after: dict[str, float], name: str) -> dict[str, Any]:
    """What a histogram (without labels) gained between two scrapes."""
    prefix = f'{name}_bucket{{le="'
    buckets = sorted(
        (float(key[len(prefix) :].split('"')[0]), value - before.get(key, 0.0))
        for key, value in after.items()
        if key.startswith(prefix)
    )
    count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
    return {
        "count": round(count),
        "sum": total,
        "mean": total / count if count else NAN,
        "p50": quantile(buckets, 0.5),
        "buckets": {f"{le:g}": n for le, n in buckets},
    }


def worker(port: int) -> Proc:
    return Proc([PY, "-m", "transcription_worker.main", "--port", str(port), "--host", "127.0.0.1",
                 "--threads", str(THREADS), "--beam-size", str(BEAM_SIZE), "--log-level", "warning"],
                f"http://127.0.0.1:{port}/health", f"longaudio-worker-{port}",
                env={"OMP_NUM_THREADS": str(THREADS)})  # fmt: skip


def frontend(port: int, route_file: Path, **chunking: Any) -> Proc:
    """A frontend with `chunking` (fields of `ChunkingSpec`) over the defaults."""
    return frontend_proc(route_file, port, f"longaudio-frontend-{port}",
                         chunking=ChunkingSpec(**chunking))  # fmt: skip


def fw_routes(path: Path, ports: tuple[int, ...]) -> Path:
    pool = PoolRoute(name="fw", engine=Engine.FASTER_WHISPER, mode=Mode.CONTINUOUS, service="fw",
                     endpoints=[f"http://127.0.0.1:{p}" for p in ports], english_only=True)  # fmt: skip
    path.write_text(
        RouteTable(model="whisper-tiny.en", aliases=["whisper-1"], pools=[pool]).dumps()
    )
    return path


def long_request(url: str, wav: Path, text: str, fe: Measured, workers: Sequence[Measured], *,
                 chunked: bool, stream: bool = False) -> dict[str, Any]:  # fmt: skip
    """One request of the whole file (OpenAI SDK, json; or streamed): its wall time, WER,
    the CPU seconds the workers and the frontend spent on it, and its chunks' latencies."""
    before = scrape(url)
    worker_cpu, frontend_cpu = [w.cpu_seconds() for w in workers], fe.cpu_seconds()
    strategy: Literal["auto"] | openai.Omit = "auto" if chunked else openai.omit
    client = sdk(url)
    deltas: list[float] = []  # when each delta arrived
    started = time.perf_counter()
    with wav.open("rb") as f:
        if stream:
            answer = ""
            events = client.audio.transcriptions.create(
                model="whisper-1", file=f, stream=True, chunking_strategy=strategy
            )
            for e in events:
                if e.type == "transcript.text.delta":
                    deltas.append(time.perf_counter() - started)
                elif e.type == "transcript.text.done":
                    answer = e.text
        else:
            answer = client.audio.transcriptions.create(
                model="whisper-1", file=f, chunking_strategy=strategy
            ).text
    wall = time.perf_counter() - started
    after = scrape(url)
    chunks = after.get(f"{CHUNKS_METRIC}_sum", 0.0) - before.get(f"{CHUNKS_METRIC}_sum", 0.0)
    each = [w.cpu_seconds() - c for w, c in zip(workers, worker_cpu, strict=True)]
    return {
        "wall_s": wall,
        "wer_pct": 100 * wer(text, answer),
        "worker_cpu_s": sum(each),
        "worker_cpu_s_each": each,  # which replicas did the work
        "frontend_cpu_s": fe.cpu_seconds() - frontend_cpu,
        "chunks": round(chunks),
        "chunk_latency": histogram(before, after, CHUNK_METRIC),
        "first_delta_s": deltas[0] if deltas else None,
        "delta_arrivals_s": deltas,
        "text": answer,
    }


def bare(wav: Path, text: str) -> dict[str, Any]:
    """faster-whisper itself on the whole file, in this process: the worker's model and beam,
    1 thread, its default condition_on_previous_text (True)."""
    from faster_whisper import WhisperModel

    from transcription_worker.main import default_model

    model = WhisperModel(default_model(), device="cpu", compute_type="int8", cpu_threads=THREADS)
    cpu, started = time.process_time(), time.perf_counter()
    segments, _ = model.transcribe(str(wav), language="en", beam_size=BEAM_SIZE)
    answer = "".join(s.text for s in segments).strip()
    return {"wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu,
            "wer_pct": 100 * wer(text, answer), "text": answer}  # fmt: skip


def gateway_prep(wav: Path) -> dict[str, Any]:
    """What the gateway does before it sends a chunk, timed here in-process on the same
    file: decode to spooled PCM, then Silero VAD and the cuts (`"auto"`, 30 s chunks)."""
    from transcription_frontend.audio.decode import decode
    from transcription_frontend.longaudio.cut import ChunkSettings, find_cuts

    started = time.perf_counter()
    with decode(wav) as decoded:
        decoded_at = time.perf_counter()
        chunks = find_cuts(decoded, ChunkSettings(normalize=True))
    done = time.perf_counter()
    return {"decode_s": decoded_at - started, "vad_and_cuts_s": done - decoded_at,
            "chunks": len(chunks), "chunk_seconds": [round(c.seconds, 2) for c in chunks]}  # fmt: skip


def short_clip(directory: Path) -> tuple[str, bytes, float]:
    """A sentence whose clip lasts 3-5 s (else the one nearest 4 s)."""
    spoken = [(s, speak(s, directory)) for s in SENTENCES + HARD_SENTENCES]
    timed = [(s, p, clip_seconds(p)) for s, p in spoken]
    fitting = [t for t in timed if 3.0 <= t[2] <= 5.0]
    s, p, seconds = fitting[0] if fitting else min(timed, key=lambda t: abs(t[2] - 4.0))
    return s, p.read_bytes(), seconds


def reported(label: str, url: str, rec: Recording, fe: Measured, workers: Sequence[Measured], *,
             chunked: bool, stream: bool = False) -> dict[str, Any]:  # fmt: skip
    """`long_request` of the whole recording, its result said in one line after `label`."""
    r = long_request(url, rec.wav, rec.text, fe, workers, chunked=chunked, stream=stream)
    say(f"{label} {r['wall_s']:.1f} s, {r['chunks']} chunks, WER {r['wer_pct']:.2f}%")
    return r


def shorts(url: str, clip: tuple[str, bytes, float], count: int | None = None,
           until: concurrent.futures.Future[Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Short requests one after another, one started every SHORT_PERIOD seconds: `count`
    of them, or until `until` is done."""
    client = sdk(url)
    latencies: list[float] = []
    errors: list[float] = []
    while (count is None or len(latencies) < count) and (until is None or not until.done()):
        started = time.perf_counter()
        answer = client.audio.transcriptions.create(
            model="whisper-1", file=("short.wav", clip[1], "audio/wav")
        )
        latencies.append(time.perf_counter() - started)
        errors.append(wer(clip[0], answer.text))
        time.sleep(max(0.0, started + SHORT_PERIOD - time.perf_counter()))
    return {
        "requests": len(latencies),
        "p50_s": pct(latencies, 50) if latencies else NAN,
        "p99_s": pct(latencies, 99) if latencies else NAN,
        "wer_pct": 100 * statistics.mean(errors) if errors else NAN,
        "latencies_s": latencies,
    }


def material(
    directory: Path, seconds: float
) -> tuple[Recording, tuple[str, bytes, float], dict[str, Any]]:
    """What both long-audio benchmarks send and compare against: the long recording, a
    short clip, and the bare engine on the whole recording (the WER reference)."""
    say(
        f"making a {seconds:.0f} s espeak-ng recording (easy and hard sentences, pauses {PAUSES[0]}-{PAUSES[1]} s)"
    )
    rec = long_recording(directory, seconds, sentences=SENTENCES + HARD_SENTENCES,
                         pause_range=PAUSES, seed=21, name=f"long-{seconds:g}s")  # fmt: skip
    short = short_clip(RESULTS / "audio")
    say(
        f"bare engine: faster-whisper in-process on the whole file ({THREADS} thread, condition_on_previous_text)"
    )
    reference = bare(rec.wav, rec.text)
    say(f"bare engine: {reference['wall_s']:.1f} s, WER {reference['wer_pct']:.2f}%")
    return rec, short, reference


def one_replica(url: str, rec: Recording, fe: Measured, workers: Sequence[Measured],
                whole: str) -> dict[str, dict[str, Any]]:  # fmt: skip
    """(a) the whole file on one replica, chunking off there (`whole` says how), and (c)
    the same with chunking_strategy=auto: chunking's own cost, without parallelism."""
    say(f"(a) 1 replica, whole file ({whole}, no chunking_strategy)")
    a = reported("(a)", url, rec, fe, workers, chunked=False)
    say("(c) 1 replica, chunked (chunking_strategy=auto)")
    return {"a": a, "c": reported("(c)", url, rec, fe, workers, chunked=True)}


def streamed(url: str, rec: Recording, fe: Measured, workers: Sequence[Measured]) -> dict[str, Any]:
    """The whole recording chunked and streamed (stream=true): when each delta arrived."""
    say("stream: 2 replicas, chunked, stream=true")
    r = long_request(url, rec.wav, rec.text, fe, workers, chunked=True, stream=True)
    say(f"stream: first delta {r['first_delta_s']}, whole {r['wall_s']:.1f} s")
    return r


def beside_long(url: str, rec: Recording, short: tuple[str, bytes, float], fe: Measured,
                workers: Sequence[Measured]) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """Short requests while one long chunked request runs: the long one's result, and the
    short ones'."""
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        running = ex.submit(long_request, url, rec.wav, rec.text, fe, workers, chunked=True)
        busy = shorts(url, short, until=running)
        return running.result(), busy


def verdict(runs: dict[str, dict[str, Any]], reference: dict[str, Any], quiet: dict[str, Any],
            busy: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """What both benchmarks conclude from (a), (b), (c) and the stream: the speed-up, the
    first delta against a chunk's latency, the short requests' slow-down, the targets met
    and each target's measured value (`shown`, as the targets table prints it)."""
    a, b, c, st = runs["a"], runs["b"], runs["c"], runs["stream"]
    speedup = a["wall_s"] / b["wall_s"]
    chunk_time = st["chunk_latency"]["mean"]
    first = st["first_delta_s"] if st["first_delta_s"] is not None else NAN
    targets = {
        f"(b) 2 replicas chunked >= {SPEEDUP_TARGET:g}x faster than (a) 1 replica whole": speedup >= SPEEDUP_TARGET,
        f"(b) chunked WER <= bare engine + {WER_POINTS:g} point": b["wer_pct"] <= reference["wer_pct"] + WER_POINTS,
        f"first delta < a chunk's mean latency + {FIRST_DELTA_SLACK_S:g} s": first < chunk_time + FIRST_DELTA_SLACK_S,
    }  # fmt: skip
    shown = [f"{speedup:.2f}x", f"{b['wer_pct']:.2f}% vs {reference['wer_pct']:.2f}% + {WER_POINTS:g}",
             f"{first:.2f} s vs {chunk_time:.2f} s + {FIRST_DELTA_SLACK_S:g}"]  # fmt: skip
    return {"speedup_b_over_a": speedup, "speedup_c_over_a": a["wall_s"] / c["wall_s"],
            "first_delta_s": first, "chunk_mean_latency_s": chunk_time, "shorts_alone": quiet,
            "shorts_beside_long": busy, "short_p50_ratio": busy["p50_s"] / quiet["p50_s"],
            "targets": targets, "shown": shown}  # fmt: skip


def short_rows(quiet: dict[str, Any], busy: dict[str, Any]) -> list[list[Any]]:
    """The short requests' table: alone, beside a long request, and the ratio of p50."""
    return [["alone", quiet["requests"], quiet["p50_s"], quiet["p99_s"], quiet["wer_pct"]],
            ["beside a long chunked request", busy["requests"], busy["p50_s"], busy["p99_s"], busy["wer_pct"]],
            ["ratio of p50", "", busy["p50_s"] / quiet["p50_s"], "", ""]]  # fmt: skip


def targets_table(targets: dict[str, bool], shown: list[str]) -> None:
    table("targets", ["target", "value", "met"],
          [[k, v, "met" if ok else "missed"] for (k, ok), v in zip(targets.items(), shown, strict=True)])  # fmt: skip


def lone_chunk(url: str, clip: Recording, repeats: int = 3) -> dict[str, Any]:
    """A ~25 s excerpt as a request of its own (sent whole: under the chunk threshold)."""
    client = sdk(url)
    times: list[float] = []
    errors: list[float] = []
    for _ in range(repeats):
        started = time.perf_counter()
        with clip.wav.open("rb") as f:
            answer = client.audio.transcriptions.create(model="whisper-1", file=f)
        times.append(time.perf_counter() - started)
        errors.append(wer(clip.text, answer.text))
    return {"seconds_of_audio": clip.seconds, "median_s": median(times), "times_s": times,
            "wer_pct": 100 * statistics.mean(errors)}  # fmt: skip


def hour_upload(rec: Recording, seconds: float, directory: Path) -> dict[str, Any]:
    """Peak frontend RSS while it chunks `seconds` of looped MP3, against a stand-in worker."""
    mp3 = directory / f"{rec.wav.stem}.{MP3_BITRATE}.mp3"
    if not mp3.exists():
        subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(rec.wav), "-c:a", "libmp3lame",
                        "-b:a", MP3_BITRATE, str(mp3)], check=True)  # fmt: skip
    upload = looped(mp3, seconds, directory / f"{mp3.stem}.looped-{seconds:g}s.mp3")
    procs: list[Proc] = []
    try:
        say("memory: starting a stand-in vLLM worker (recorded answers) and a frontend")
        procs.append(standin_worker(STANDIN))
        rf = standin_routes(RESULTS / "routes-longaudio-standin.json",
                            {"batch": [f"http://127.0.0.1:{STANDIN}"]})  # fmt: skip
        fe = frontend(FRONTEND_STANDIN, rf)
        procs.append(fe)
        url = f"http://127.0.0.1:{FRONTEND_STANDIN}"
        fresh = fe.rss_kib()
        say(f"memory: warming up (a 0.5 s tone, then the {rec.seconds:.0f} s recording chunked)")
        client = sdk(url)
        client.audio.transcriptions.create(model="whisper-1", file=("a.wav", tone_wav(0.5)))
        with rec.wav.open("rb") as f:
            client.audio.transcriptions.create(model="whisper-1", file=f, chunking_strategy="auto")
        scraped = scrape(url)
        say(
            f"memory: {seconds / 60:.0f} minutes of MP3 ({upload.stat().st_size / 1e6:.1f} MB), chunked"
        )

        def chunked() -> Any:
            with upload.open("rb") as f:
                return client.audio.transcriptions.create(
                    model="whisper-1",
                    file=f,
                    chunking_strategy="auto",
                    response_format="verbose_json",
                )

        started = time.perf_counter()
        answer, before, peak = fe.peak_during(chunked)
        wall = time.perf_counter() - started
        after = scrape(url)
    finally:
        for p in reversed(procs):
            p.stop()
    chunks = after.get(f"{CHUNKS_METRIC}_sum", 0.0) - scraped.get(f"{CHUNKS_METRIC}_sum", 0.0)
    return {
        "worker": "stand-in vLLM worker (bench/standin_server.py, recorded answers)",
        "audio_seconds": seconds,
        "answer_duration_s": answer.duration,
        "upload_bytes": upload.stat().st_size,
        "chunks": round(chunks),
        "wall_s": wall,
        "rss_fresh_mib": fresh / 1024,
        "rss_before_mib": before / 1024,
        "rss_peak_mib": peak / 1024,
        "added_mib": (peak - before) / 1024,
    }


def run(quick: bool = False) -> dict[str, Any]:
    seconds = 120.0 if quick else 600.0
    hour = 1200.0 if quick else 3600.0
    baseline_count = SHORT_BASELINE // 2 if quick else SHORT_BASELINE
    directory = RESULTS / "longaudio"
    cpus, load_before = len(os.sched_getaffinity(0)), os.getloadavg()[0]
    say(f"long audio on {WHERE}: {cpus} CPUs, load average {load_before:.2f}")
    rec, short, reference = material(directory, seconds)
    lone = excerpt(
        rec, EXCERPT_SECONDS, directory / f"long-{seconds:g}s-first-{EXCERPT_SECONDS:g}s.wav"
    )
    say(f"{rec.seconds:.1f} s, {len(rec.sentences)} sentences, {len(rec.text.split())} words; "
        f"lone chunk {lone.seconds:.1f} s; short request {short[2]:.1f} s: {short[0]!r}")  # fmt: skip

    say("the gateway's work before its first chunk, in-process: decode, Silero VAD, cuts")
    prep = gateway_prep(rec.wav)
    say(
        f"decode {prep['decode_s']:.2f} s, VAD and cuts {prep['vad_and_cuts_s']:.2f} s, {prep['chunks']} chunks"
    )

    procs: list[Proc] = []
    runs: dict[str, dict[str, Any]] = {}
    try:
        say(f"starting 2 CPU workers (tiny.en, --threads {THREADS} each) and 2 frontends")
        workers = [worker(p) for p in WORKERS]
        procs += workers
        fe_one = frontend(FRONTEND_ONE, fw_routes(RESULTS / "routes-longaudio-1.json", WORKERS[:1]),
                          enabled=False)  # fmt: skip
        procs.append(fe_one)
        fe_two = frontend(FRONTEND_TWO, fw_routes(RESULTS / "routes-longaudio-2.json", WORKERS))
        procs.append(fe_two)
        fe_chained = frontend(FRONTEND_CHAINED, fw_routes(RESULTS / "routes-longaudio-2.json",
                                                          WORKERS), previous_text=True)  # fmt: skip
        procs.append(fe_chained)
        one, two = f"http://127.0.0.1:{FRONTEND_ONE}", f"http://127.0.0.1:{FRONTEND_TWO}"
        chained = f"http://127.0.0.1:{FRONTEND_CHAINED}"
        say("warming up (the short sentence on each worker, then through each frontend)")
        for url in (*(f"http://127.0.0.1:{p}" for p in WORKERS), one, two, chained):
            shorts(url, short, count=1)

        runs |= one_replica(one, rec, fe_one, workers, "chunking.enabled false")
        say("(b) 2 replicas, chunked (chunking_strategy=auto)")
        runs["b"] = reported("(b)", two, rec, fe_two, workers, chunked=True)
        say("(b) again, each chunk prompted with the text before it (chunking.previous_text)")
        runs["b_chained"] = reported("(b) chained", chained, rec, fe_chained, workers, chunked=True)
        runs["stream"] = streamed(two, rec, fe_two, workers)
        say(f"lone chunk: the first {lone.seconds:.1f} s as a request of its own, 3 times")
        single = lone_chunk(two, lone)
        say(f"short requests: {baseline_count}, one every {SHORT_PERIOD:g} s, nothing else running")
        quiet = shorts(two, short, count=baseline_count)
        say("short requests while a long one runs (2 replicas, chunked)")
        runs["b_with_shorts"], busy = beside_long(two, rec, short, fe_two, workers)
        say(
            f"short p50 {quiet['p50_s']:.3f} s alone, {busy['p50_s']:.3f} s beside the long request"
        )
    finally:
        for p in reversed(procs):
            p.stop()

    memory = hour_upload(rec, hour, directory)
    say(
        f"memory: {memory['added_mib']:.1f} MiB added ({memory['chunks']} chunks, {memory['wall_s']:.1f} s)"
    )

    a, b, c, st = runs["a"], runs["b"], runs["c"], runs["stream"]
    found = verdict(runs, reference, quiet, busy)
    first, chunk_time = found["first_delta_s"], found["chunk_mean_latency_s"]
    load_after = os.getloadavg()[0]
    targets = found["targets"] | {
        f"{hour / 60:.0f}-minute upload adds < {MEMORY_TARGET_MIB:g} MiB to the frontend": memory["added_mib"] < MEMORY_TARGET_MIB,
    }  # fmt: skip
    result = {
        "where": WHERE,
        "cpus": cpus,
        "load_average_1m": {"before": load_before, "after": load_after},
        "model": f"whisper tiny.en (faster-whisper worker, CTranslate2 int8, beam {BEAM_SIZE}, {THREADS} thread per replica)",
        "recording": {"seconds": rec.seconds, "sentences": len(rec.sentences), "words": len(rec.text.split()),
                      "pause_range_s": list(PAUSES), "wav": str(rec.wav)},
        "bare": reference,
        "runs": runs,
        "lone_chunk": single,
        "gateway_prep": prep,
        "short_clip": {"text": short[0], "seconds": short[2]},
        "memory": memory,
        **{k: v for k, v in found.items() if k != "shown"},
        "targets": targets,
    }  # fmt: skip

    table(f"One {rec.seconds:.0f} s request ({len(rec.sentences)} sentences), {WHERE} ({cpus} CPUs, "
          f"load average {load_before:.1f} before, {load_after:.1f} after); tiny.en, {THREADS} thread per worker replica",
          ["", "wall s", "x (a)", "WER %", "worker CPU s", "per replica", "frontend CPU s", "chunks", "chunk p50 s", "chunk mean s"],
          [["bare engine, whole file, in-process", reference["wall_s"], a["wall_s"] / reference["wall_s"],
            reference["wer_pct"], reference["cpu_s"], "-", "-", "-", "-", "-"]]
          + [[label, r["wall_s"], a["wall_s"] / r["wall_s"], r["wer_pct"], r["worker_cpu_s"],
              " + ".join(f"{x:.1f}" for x in r["worker_cpu_s_each"]), r["frontend_cpu_s"],
              r["chunks"], r["chunk_latency"]["p50"], r["chunk_latency"]["mean"]]
             for label, r in (("(a) 1 replica, whole (chunking off)", a), ("(c) 1 replica, chunked (auto)", c),
                              ("(b) 2 replicas, chunked (auto)", b),
                              ("(b) previous text as prompt (previousText)", runs["b_chained"]),
                              ("stream, 2 replicas, chunked", st),
                              ("(b) beside short requests", runs["b_with_shorts"]))])  # fmt: skip
    table("Streaming: first delta against one chunk's time (2 replicas)", ["", "seconds"],
          [["first delta (stream=true, chunked)", first],
           ["every delta arrived at", ", ".join(f"{t:.2f}" for t in st["delta_arrivals_s"])],
           ["whole stream", st["wall_s"]],
           ["gateway before its first chunk: decode + VAD + cuts (in-process)", prep["decode_s"] + prep["vad_and_cuts_s"]],
           ["chunk latency in that request, mean (/metrics sum/count)", chunk_time],
           ["chunk latency in that request, p50 (/metrics buckets, interpolated)", st["chunk_latency"]["p50"]],
           [f"lone {single['seconds_of_audio']:.1f} s excerpt as its own request, median of 3", single["median_s"]]])  # fmt: skip
    table(
        f"Short requests ({short[2]:.1f} s sentence, one every {SHORT_PERIOD:g} s, sequential; 2 replicas)",
        ["", "requests", "p50 s", "p99 s", "WER %"],
        short_rows(quiet, busy),
    )
    table(f"Frontend memory, a {hour / 60:.0f}-minute MP3 upload chunked, against a stand-in worker",
          ["upload MB", "chunks", "wall s", "RSS fresh MiB", "RSS before MiB", "peak MiB", "added MiB"],
          [[memory["upload_bytes"] / 1e6, memory["chunks"], memory["wall_s"], memory["rss_fresh_mib"],
            memory["rss_before_mib"], memory["rss_peak_mib"], memory["added_mib"]]])  # fmt: skip
    targets_table(targets, [*found["shown"], f"{memory['added_mib']:.1f} MiB"])
    write("longaudio", result)
    return result
