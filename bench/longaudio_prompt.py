"""Does passing the previous chunk's text as the next chunk's prompt help WER (issue 21)?

The long-audio benchmark's recording (bench/longaudio.py: 600 s of espeak-ng sentences,
easy and hard, 0.3-1.5 s pauses; 120 s with --quick) is cut as the gateway cuts it by
default (`longaudio.cut`: decode, Silero VAD, `"auto"`, 30 s chunks ending after 28.5 s;
the variable TARGET_CHUNK_SECONDS sets another end), and the chunks (16 kHz FLAC, as the
gateway encodes them) go straight to one real CPU worker (faster-whisper tiny.en, 1
thread), four times:

- **independent**: each chunk alone, one after another;
- **previous text**: each chunk prompted with the text before it (its last 100 words: what
  faster-whisper's `condition_on_previous_text` does inside one file), one after another;
- the same two with the chunks in 4 runs of consecutive chunks at once, each run in order
  (what `spec.frontend.chunking.previousText` does with `maxParallelChunks: 4`).

Each pass's joined text is scored against the sentences spoken (WER, and its word count
against the script's), beside the bare engine decoding the whole file. No target: the
issue asks whether it helps.
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx

from testkit.audio import HARD_SENTENCES, SENTENCES, wer

from .common import RESULTS, say, table, write
from .longaudio import PAUSES, bare, worker

PORT = 18786
PROMPT_WORDS = 100  # the end of the text before (Whisper reads ~224 tokens of prompt)
TARGET = float(os.environ.get("TARGET_CHUNK_SECONDS", "28.5"))  # the gateway's default cut


def transcribe(url: str, audio: bytes, prompt: str | None) -> str:
    data = {"model": "whisper-tiny.en", "response_format": "json"}
    if prompt:
        data["prompt"] = prompt
    r = httpx.post(f"{url}/v1/audio/transcriptions", data=data,
                   files={"file": ("chunk.flac", audio, "audio/flac")}, timeout=300)  # fmt: skip
    r.raise_for_status()
    return str(r.json()["text"]).strip()


def chunk_texts(url: str, pieces: list[bytes], chained: bool, parallel: int) -> list[str]:
    """Each chunk's text: `parallel` runs of consecutive chunks at once (the gateway's
    runs), each run in order; `chained`: each chunk prompted with the run's text so far."""
    from concurrent.futures import ThreadPoolExecutor

    from transcription_frontend.longaudio.fanout import runs

    texts: list[str] = [""] * len(pieces)

    def one_run(r: range) -> None:
        for i in r:
            before = " ".join(texts[r.start : i]).split()[-PROMPT_WORDS:] if chained else []
            texts[i] = transcribe(url, pieces[i], " ".join(before) or None)

    with ThreadPoolExecutor(parallel) as ex:
        list(ex.map(one_run, runs(len(pieces), parallel)))
    return texts


def run(quick: bool = False) -> dict[str, Any]:
    from testkit.longaudio import long_recording
    from transcription_frontend.audio.decode import decode
    from transcription_frontend.longaudio.cut import ChunkSettings, encode, find_cuts

    seconds = 120.0 if quick else 600.0
    directory = RESULTS / "longaudio"
    rec = long_recording(directory, seconds, sentences=SENTENCES + HARD_SENTENCES,
                         pause_range=PAUSES, seed=21, name=f"long-{seconds:g}s")  # fmt: skip
    say(f"{rec.seconds:.1f} s, {len(rec.sentences)} sentences; cutting it as the gateway does")
    decoded = decode(rec.wav)
    try:
        chunks = find_cuts(decoded, ChunkSettings(target_chunk_seconds=TARGET, normalize=True))
        pieces = [encode(decoded, c) for c in chunks]
    finally:
        decoded.close()
    say(f"{len(chunks)} chunks; the bare engine on the whole file for reference")
    reference = bare(rec.wav, rec.text)
    passes: dict[str, dict[str, Any]] = {}
    proc = worker(PORT)
    try:
        url = f"http://127.0.0.1:{PORT}"
        transcribe(url, pieces[0], None)  # warm-up
        for name, chained, parallel in (("independent", False, 1), ("previous text", True, 1),
                                        ("independent, 4 at once", False, 4),
                                        ("previous text, 4 runs at once", True, 4)):  # fmt: skip
            say(f"{name}: {len(pieces)} chunks")
            t0 = time.monotonic()
            texts = chunk_texts(url, pieces, chained, parallel)
            text = " ".join(texts)
            passes[name] = {"wall_s": time.monotonic() - t0, "wer_pct": 100 * wer(rec.text, text),
                            "words": len(text.split()), "text": text}  # fmt: skip
            say(f"{name}: WER {passes[name]['wer_pct']:.2f}% in {passes[name]['wall_s']:.1f} s")
    finally:
        proc.stop()
    table(f"Previous chunk's text as the prompt: {rec.seconds:.0f} s recording, {len(chunks)} "
          f"chunks (ending after {TARGET:g} s), one CPU worker (tiny.en, 1 thread)",
          ["pass", "WER %", "words", "wall s"],
          [["bare engine, whole file (condition_on_previous_text)", reference["wer_pct"],
            len(reference["text"].split()), reference["wall_s"]],
           *[[k, v["wer_pct"], v["words"], v["wall_s"]] for k, v in passes.items()]])  # fmt: skip
    data = {"recording_s": rec.seconds, "chunks": len(chunks), "target_chunk_seconds": TARGET,
            "prompt_words": PROMPT_WORDS,
            "bare": reference, "passes": passes}  # fmt: skip
    write("longaudio-prompt", data)
    return data
