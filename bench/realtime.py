"""Realtime transcription benchmark (`GET /v1/realtime?intent=transcription`, issue 23): how
long a turn takes once the server VAD has found its end, against the same audio sent as
HTTP transcriptions, on the real frontend process and the real CPU worker (faster-whisper,
Whisper tiny.en, continuous batching).

Each session streams espeak-ng sentences (the easy ones and the hard ones, for WER) with
1 s pauses between them, at real time, as 24 kHz PCM in 20-100 ms appends
(`testkit.realtime.transcribe_turns`). Sessions start 0.3 s apart and each begins at another
sentence, so that their turns do not all end at once. At 1, 4 and 8 sessions (1 and 2 with
--quick, on fewer sentences):

- realtime latency: from a turn's `input_audio_buffer.speech_stopped` arriving to its
  `conversation.item.input_audio_transcription.completed` arriving, p50/p99;
- HTTP reference: each sentence's turn audio (cut from the stream where its turns began
  and ended, so the same samples), as a WAV through the same frontend with the OpenAI SDK
  (`client.audio.transcriptions.create`), each sent when its turn's speech_stopped arrived
  in the realtime run (same concurrency, same arrival times): p50/p99 from send to answer;
- VAD delay: speech_stopped's arrival minus the moment the append carrying the last sample
  of the sentence's speech (before its trailing silence; the last sample above -40 dBFS)
  was sent, minus the session's `silence_duration_ms`: what the VAD adds beyond the silence
  it is configured to wait for. Also shown: the same in audio time (`audio_end_ms` against
  the speech's end plus the silence);
- WER of each sentence's realtime transcript (its turns' transcripts joined) and of its
  HTTP transcript.

Targets: realtime p50 <= 1.2x HTTP p50 at each concurrency; VAD delay p99 < 300 ms at each
concurrency; realtime WER <= HTTP WER + 1 point (all rows together). Reported too: the most
concurrent sessions (of the rows run) whose realtime p99 stays under 2 s.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from testkit.audio import HARD_SENTENCES, SENTENCES, wer
from testkit.realtime import RATE, conversation, pcm, silence, transcribe_turns
from transcription_api.capabilities import Engine, Mode
from transcription_api.frontend import FrontendLimits
from transcription_api.routes import PoolRoute, RouteTable
from transcription_frontend.audio.encode import wav

from .common import PY, RESULTS, Proc, frontend_proc, pct, say, table, write

FRONTEND, WORKER = 18770, 18771
CONCURRENCY = (1, 4, 8)
QUICK_CONCURRENCY = (1, 2)
PAUSE = 1.0  # seconds of silence between sentences
STAGGER = 0.3  # seconds between session starts
SPEECH_FLOOR = 0.01  # -40 dBFS: quieter samples at a sentence's end are its trailing silence
RATIO_TARGET = 1.2
VAD_TARGET_MS = 300.0
WER_POINTS = 1.0
P99_LIMIT_S = 2.0


@dataclass
class Sentence:
    text: str
    start: float  # where its audio begins in the session's stream (s)
    end: float  # where its audio ends, trailing silence included (s)
    speech_end: float  # the end of its last sample above SPEECH_FLOOR (s)


@dataclass
class Turn:
    item: str
    start_ms: int = 0
    end_ms: int = 0
    stopped_at: float | None = None  # monotonic arrival of speech_stopped
    completed_at: float | None = None  # ... of transcription.completed (or .failed)
    transcript: str = ""
    failed: bool = False


@dataclass
class Session:
    """One session's stream and what came back."""

    audio: bytes
    sentences: list[Sentence]
    appended: list[tuple[float, float]] = field(default_factory=list)  # (time, s sent)
    turns: dict[str, Turn] = field(default_factory=dict)
    silence_ms: int | None = None
    error: str | None = None

    def on_event(self, t: float, e: Any) -> None:
        if e.type == "session.updated":
            detection = e.session.audio.input.turn_detection
            self.silence_ms = getattr(detection, "silence_duration_ms", None)
        elif e.type == "input_audio_buffer.speech_started":
            self.turns[e.item_id] = Turn(e.item_id, start_ms=e.audio_start_ms)
        elif e.type == "input_audio_buffer.speech_stopped":
            turn = self.turns.setdefault(e.item_id, Turn(e.item_id))
            turn.end_ms, turn.stopped_at = e.audio_end_ms, t
        elif e.type == "conversation.item.input_audio_transcription.completed":
            turn = self.turns.setdefault(e.item_id, Turn(e.item_id))
            turn.transcript, turn.completed_at = e.transcript, t
        elif e.type == "conversation.item.input_audio_transcription.failed":
            turn = self.turns.setdefault(e.item_id, Turn(e.item_id))
            turn.failed, turn.completed_at = True, t

    def on_append(self, t: float, sent: float) -> None:
        self.appended.append((t, sent))

    @property
    def started(self) -> float | None:
        return self.appended[0][0] if self.appended else None

    def sent_at(self, seconds: float) -> float | None:
        """When the append carrying the audio at `seconds` was sent."""
        for t, sent in self.appended:
            if sent >= seconds:
                return t
        return None

    def by_sentence(self) -> list[list[Turn]]:
        """Each sentence's turns: those whose audio overlaps it most."""
        out: list[list[Turn]] = [[] for _ in self.sentences]
        for turn in self.turns.values():
            if turn.stopped_at is None:
                continue
            a, b = turn.start_ms / 1000, turn.end_ms / 1000
            overlaps = [min(b, s.end) - max(a, s.start) for s in self.sentences]
            best = max(range(len(overlaps)), key=overlaps.__getitem__)
            if overlaps[best] > 0:
                out[best].append(turn)
        return [sorted(ts, key=lambda t: t.start_ms) for ts in out]


def stream(texts: list[str], directory: Path) -> tuple[bytes, list[Sentence]]:
    """The session's audio (testkit's conversation) and where each sentence lies in it."""
    audio = conversation(texts, directory, pause=PAUSE)
    clips = [pcm(t, directory) for t in texts]
    gap = len(silence(PAUSE))
    position = (len(audio) - sum(len(c) for c in clips) - gap * len(clips)) // 2  # lead-in
    sentences = []
    for text, clip in zip(texts, clips, strict=True):
        samples = np.abs(np.frombuffer(clip, dtype="<i2").astype(np.int32))
        loud = np.nonzero(samples >= SPEECH_FLOOR * 32768)[0]
        last = int(loud[-1]) + 1 if loud.size else len(samples)
        start = position / RATE
        sentences.append(Sentence(text, start, start + len(samples) / RATE, start + last / RATE))
        position += len(samples) + gap // 2
    return audio, sentences


async def realtime(url: str, sessions: list[Session]) -> None:
    async def one(i: int, s: Session) -> None:
        await asyncio.sleep(i * STAGGER)
        try:
            await transcribe_turns(url, s.audio, len(s.sentences), pace=1.0,
                                   on_event=s.on_event, on_append=s.on_append)  # fmt: skip
        except Exception as e:  # reported with the row; what arrived still counts
            s.error = f"{type(e).__name__}: {e}"

    await asyncio.gather(*(one(i, s) for i, s in enumerate(sessions)))


@dataclass
class Request:
    text: str
    clip: bytes
    at: float  # seconds after the HTTP run starts
    latency: float | None = None
    transcript: str = ""
    error: str | None = None


def requests_for(sessions: list[Session]) -> list[Request]:
    """Each sentence's turn audio as one request, when its turn's speech_stopped arrived in
    the realtime run (relative to the first session's start); a sentence no turn covered:
    its own span, when its silence would have ended."""
    out = []
    starts = [s.started for s in sessions]
    began = min((t for t in starts if t is not None), default=0.0)
    for i, (s, start) in enumerate(zip(sessions, starts, strict=True)):
        offset = i * STAGGER if start is None else start - began
        for sentence, turns in zip(s.sentences, s.by_sentence(), strict=True):
            stopped = turns[-1].stopped_at if turns else None
            if turns and stopped is not None and start is not None:
                a, b = turns[0].start_ms / 1000, turns[-1].end_ms / 1000
                at = stopped - began
            else:
                a, b = sentence.start, sentence.end
                at = offset + sentence.speech_end + (s.silence_ms or 500) / 1000
            clip = s.audio[2 * round(a * RATE) : 2 * round(b * RATE)]
            out.append(Request(sentence.text, wav(clip, RATE), at))
    return out


async def http(url: str, requests: list[Request]) -> None:
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                                timeout=300)  # fmt: skip
    began = time.monotonic()

    async def one(r: Request) -> None:
        await asyncio.sleep(max(0.0, began + r.at - time.monotonic()))
        t = time.monotonic()
        try:
            answer = await client.audio.transcriptions.create(
                model="whisper-1", file=("turn.wav", r.clip, "audio/wav")
            )
            r.latency, r.transcript = time.monotonic() - t, answer.text
        except openai.OpenAIError as e:
            r.error = f"{type(e).__name__}: {e}"

    await asyncio.gather(*(one(r) for r in requests))
    await client.close()


def row(url: str, texts: list[str], n: int, directory: Path) -> dict[str, Any]:
    """`n` sessions at once, then the same turns' audio over HTTP at the same times."""
    sessions = []
    for i in range(n):
        k = (i * len(texts) // n) % len(texts)
        sessions.append(Session(*stream(texts[k:] + texts[:k], directory)))
    asyncio.run(realtime(url, sessions))
    requests = requests_for(sessions)
    asyncio.run(http(url, requests))

    turns = [t for s in sessions for t in s.turns.values()]
    latency: list[float] = []
    unanswered = 0
    for t in turns:
        if t.stopped_at is None or t.completed_at is None:
            unanswered += 1
        elif not t.failed:
            latency.append(t.completed_at - t.stopped_at)
    vad_ms, audio_ms, rt_wer = [], [], []
    for s in sessions:
        silence_ms = s.silence_ms if s.silence_ms is not None else 0
        for sentence, ts in zip(s.sentences, s.by_sentence(), strict=True):
            rt_wer.append(wer(sentence.text, " ".join(t.transcript for t in ts)))
            if not ts:
                continue
            sent = s.sent_at(sentence.speech_end)
            stopped = ts[-1].stopped_at
            if sent is not None and stopped is not None:
                vad_ms.append((stopped - sent) * 1000 - silence_ms)
            audio_ms.append(ts[-1].end_ms - sentence.speech_end * 1000 - silence_ms)
    http_lat = [r.latency for r in requests if r.latency is not None]
    http_wer = [wer(r.text, r.transcript) for r in requests]
    nan = float("nan")
    out: dict[str, Any] = {
        "sessions": n,
        "sentences": len(texts) * n,
        "turns": len(turns),
        "turns_failed": sum(t.failed for t in turns),
        "turns_unanswered": unanswered,
        "session_errors": [s.error for s in sessions if s.error],
        "silence_duration_ms": sorted({s.silence_ms for s in sessions if s.silence_ms}),
        "realtime_p50_s": pct(latency, 50) if latency else nan,
        "realtime_p99_s": pct(latency, 99) if latency else nan,
        "http_requests": len(requests),
        "http_errors": [r.error for r in requests if r.error],
        "http_p50_s": pct(http_lat, 50) if http_lat else nan,
        "http_p99_s": pct(http_lat, 99) if http_lat else nan,
        "vad_delay_p50_ms": pct(vad_ms, 50) if vad_ms else nan,
        "vad_delay_p99_ms": pct(vad_ms, 99) if vad_ms else nan,
        "vad_audio_offset_p50_ms": pct(audio_ms, 50) if audio_ms else nan,
        "realtime_wer_pct": 100 * statistics.mean(rt_wer),
        "http_wer_pct": 100 * statistics.mean(http_wer),
        "realtime_latencies_s": latency,
        "http_latencies_s": http_lat,
        "vad_delays_ms": vad_ms,
    }
    out["ratio_p50"] = out["realtime_p50_s"] / out["http_p50_s"]
    return out


def frontend(route_file: Path) -> Proc:
    # Sessions wait for their last turns without sending: no idle close meanwhile.
    return frontend_proc(route_file, FRONTEND, "realtime-frontend",
                         limits=FrontendLimits(realtime_idle_timeout_seconds=600))  # fmt: skip


def run(quick: bool = False) -> dict[str, Any]:
    texts = SENTENCES[:2] + HARD_SENTENCES[:2] if quick else SENTENCES + HARD_SENTENCES
    levels = QUICK_CONCURRENCY if quick else CONCURRENCY
    procs: list[Proc] = []
    try:
        say("starting the CPU worker (faster-whisper, Whisper tiny.en, continuous batching)")
        procs.append(Proc([PY, "-m", "transcription_worker.main", "--port", str(WORKER),
                           "--host", "127.0.0.1", "--log-level", "warning"],
                          f"http://127.0.0.1:{WORKER}/health", "realtime-worker"))  # fmt: skip
        pool = PoolRoute(name="fw", engine=Engine.FASTER_WHISPER, mode=Mode.CONTINUOUS,
                         service="fw", endpoints=[f"http://127.0.0.1:{WORKER}"], english_only=True)  # fmt: skip
        route_file = RESULTS / "routes-realtime.json"
        route_file.write_text(
            RouteTable(model="whisper-tiny.en", aliases=["whisper-1"], pools=[pool]).dumps()
        )
        say("starting the frontend")
        procs.append(frontend(route_file))
        return measure(f"http://127.0.0.1:{FRONTEND}", texts, levels, RESULTS / "audio",
                       where="local processes (1 faster-whisper worker, 1 frontend)",
                       name="realtime")  # fmt: skip
    finally:
        for p in reversed(procs):
            p.stop()


def measure(url: str, texts: list[str], levels: tuple[int, ...], directory: Path, *,
            where: str, name: str) -> dict[str, Any]:  # fmt: skip
    """A warm-up, then one row per concurrency level against the frontend at `url`; prints
    the tables and writes bench-results/<name>.json."""
    rows: list[dict[str, Any]] = []
    say("warming up (one sentence, realtime and HTTP)")
    row(url, texts[:1], 1, directory)
    seconds = len(stream(texts, directory)[0]) / 2 / RATE
    for n in levels:
        say(
            f"{n} session(s): {len(texts)} sentences each ({seconds:.0f} s at real time), then HTTP"
        )
        r = row(url, texts, n, directory)
        rows.append(r)
        say(f"{n} session(s): realtime p50 {r['realtime_p50_s']:.3f} s p99 {r['realtime_p99_s']:.3f} s; "
            f"HTTP p50 {r['http_p50_s']:.3f} s p99 {r['http_p99_s']:.3f} s; "
            f"VAD delay p50 {r['vad_delay_p50_ms']:.0f} ms; WER {r['realtime_wer_pct']:.1f}% "
            f"(HTTP {r['http_wer_pct']:.1f}%); {r['turns']} turns, {r['turns_failed']} failed")  # fmt: skip

    sentences = sum(r["sentences"] for r in rows)
    rt_wer = sum(r["realtime_wer_pct"] * r["sentences"] for r in rows) / sentences
    http_wer = sum(r["http_wer_pct"] * r["sentences"] for r in rows) / sentences
    holding = [r["sessions"] for r in rows if r["realtime_p99_s"] < P99_LIMIT_S]
    most = max(holding, default=0)
    targets: dict[str, bool] = {}
    for r in rows:
        n = r["sessions"]
        targets[f"realtime p50 <= {RATIO_TARGET}x HTTP p50, {n} session(s)"] = (
            r["ratio_p50"] <= RATIO_TARGET
        )
        targets[f"VAD delay p99 < {VAD_TARGET_MS:.0f} ms, {n} session(s)"] = (
            r["vad_delay_p99_ms"] < VAD_TARGET_MS
        )
        targets[f"every turn transcribed, {n} session(s)"] = (
            r["turns"] == r["sentences"] and not r["turns_failed"] and not r["turns_unanswered"]
            and not r["session_errors"] and not r["http_errors"]
        )  # fmt: skip
    targets[f"realtime WER <= HTTP WER + {WER_POINTS:g} point"] = rt_wer <= http_wer + WER_POINTS
    result = {
        "where": where,
        "model": "whisper tiny.en (faster-whisper worker, CTranslate2 int8, continuous batching)",
        "sentences_per_session": len(texts),
        "pause_seconds": PAUSE,
        "pace": 1.0,
        "rows": rows,
        "realtime_wer_pct": rt_wer,
        "http_wer_pct": http_wer,
        "most_sessions_p99_under_2s": most,
        "most_sessions_is_lower_bound": most == max(levels),
        "targets": targets,
    }
    table(f"Realtime turns (speech_stopped -> completed) vs the same audio over HTTP, same "
          f"concurrency; {where}",
          ["sessions", "turns", "failed", "RT p50 s", "RT p99 s", "HTTP p50 s", "HTTP p99 s",
           "RT/HTTP p50", "VAD p50 ms", "VAD p99 ms", "VAD audio ms", "RT WER %", "HTTP WER %"],
          [[r["sessions"], r["turns"], r["turns_failed"], r["realtime_p50_s"], r["realtime_p99_s"],
            r["http_p50_s"], r["http_p99_s"], r["ratio_p50"], r["vad_delay_p50_ms"],
            r["vad_delay_p99_ms"], r["vad_audio_offset_p50_ms"], r["realtime_wer_pct"],
            r["http_wer_pct"]] for r in rows])  # fmt: skip
    bound = "+" if result["most_sessions_is_lower_bound"] else ""
    table("summary", ["", "value"],
          [["realtime WER % (all rows)", rt_wer], ["HTTP WER % (all rows)", http_wer],
           [f"most sessions with p99 < {P99_LIMIT_S:g} s", f"{most}{bound}"]])  # fmt: skip
    table("targets", ["target", "met"],
          [[k, "met" if v else "missed"] for k, v in targets.items()])  # fmt: skip
    write(name, result)
    return result
