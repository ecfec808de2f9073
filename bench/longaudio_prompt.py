"""Does passing the previous chunk's text as the next chunk's prompt help WER (issue 21)?

The long-audio benchmark's recording (bench/longaudio.py: 600 s of espeak-ng sentences,
easy and hard, 0.3-1.5 s pauses; 120 s with --quick) is cut exactly as the gateway cuts it
(`longaudio.cut`: decode, Silero VAD, `"auto"`), and the chunks are sent one after another
to one real CPU worker (faster-whisper tiny.en, 1 thread), as the gateway encodes them
(16 kHz FLAC), twice:

- **independent**: each chunk alone, as the gateway sends them today (in parallel, so no
  chunk can wait for the text before it);
- **previous text**: each chunk with the text of the chunk before it as its `prompt` (what
  faster-whisper's `condition_on_previous_text` does inside one file; it forces the chunks
  to run one after another).

Each pass's joined text is scored against the sentences spoken (WER), and both against the
bare engine decoding the whole file (bench/longaudio.py's reference). Reported: WER and the
wall time of each pass (no target: the issue asks whether it helps).
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from testkit.audio import HARD_SENTENCES, SENTENCES, wer

from .common import RESULTS, say, table, write
from .longaudio import PAUSES, bare, worker

PORT = 18786
PROMPT_WORDS = 100  # the end of the previous chunk's text (Whisper's prompt is ~224 tokens)


def transcribe(url: str, audio: bytes, prompt: str | None) -> str:
    data = {"model": "whisper-tiny.en", "response_format": "json"}
    if prompt:
        data["prompt"] = prompt
    r = httpx.post(f"{url}/v1/audio/transcriptions", data=data,
                   files={"file": ("chunk.flac", audio, "audio/flac")}, timeout=300)  # fmt: skip
    r.raise_for_status()
    return str(r.json()["text"]).strip()


def run(quick: bool = False) -> dict[str, Any]:
    from testkit.longaudio import long_recording
    from transcription_frontend.longaudio.cut import ChunkSettings, decode, encode, find_cuts

    seconds = 120.0 if quick else 600.0
    directory = RESULTS / "longaudio"
    rec = long_recording(directory, seconds, sentences=SENTENCES + HARD_SENTENCES,
                         pause_range=PAUSES, seed=21, name=f"long-{seconds:g}s")  # fmt: skip
    say(f"{rec.seconds:.1f} s, {len(rec.sentences)} sentences; cutting it as the gateway does")
    decoded = decode(rec.wav)
    try:
        chunks = find_cuts(decoded, ChunkSettings(normalize=True))
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
        for name, chained in (("independent", False), ("previous text", True)):
            say(f"{name}: {len(pieces)} chunks, one after another")
            t0, texts = time.monotonic(), []
            for audio in pieces:
                prompt = " ".join(" ".join(texts).split()[-PROMPT_WORDS:]) if chained else None
                texts.append(transcribe(url, audio, prompt))
            text = " ".join(texts)
            passes[name] = {"wall_s": time.monotonic() - t0, "wer_pct": 100 * wer(rec.text, text),
                            "text": text}  # fmt: skip
            say(f"{name}: WER {passes[name]['wer_pct']:.2f}% in {passes[name]['wall_s']:.1f} s")
    finally:
        proc.stop()
    table(f"Previous chunk's text as the prompt: {rec.seconds:.0f} s recording, {len(chunks)} "
          "chunks, one CPU worker (tiny.en, 1 thread), chunks sent one after another",
          ["pass", "WER %", "wall s"],
          [["bare engine, whole file (condition_on_previous_text)", reference["wer_pct"],
            reference["wall_s"]],
           *[[k, v["wer_pct"], v["wall_s"]] for k, v in passes.items()]])  # fmt: skip
    data = {"recording_s": rec.seconds, "chunks": len(chunks), "prompt_words": PROMPT_WORDS,
            "bare": reference, "passes": passes}  # fmt: skip
    write("longaudio-prompt", data)
    return data
