"""Real test audio: sentences spoken by espeak-ng, converted with sox/ffmpeg; and WER."""

from __future__ import annotations

import math
import os
import re
import shutil
import struct
import subprocess
from functools import cache
from pathlib import Path

from transcription_frontend.audio.encode import wav

# Sentences that Whisper tiny.en transcribes well from espeak-ng's voice (0% WER here);
# others, such as "the quick brown fox", come out garbled by the synthetic voice.
SENTENCES = [
    "Please transcribe this short sentence for the test.",
    "Speech recognition turns spoken words into written text.",
    "The meeting has been moved to Thursday afternoon.",
    "Please send me the report before the end of the week.",
]

# Sentences tiny.en gets wrong from espeak-ng's voice (names, rare words, tongue twisters,
# homophones); two of them send greedy and beam decoding into repetition loops that only the
# temperature fallback gets out of. For benchmarks that must report WER honestly.
HARD_SENTENCES = [
    "We will need three more chairs for the conference room.",
    "Could you call me back when you have a free moment?",
    "Their colonel read the rough draft, though he thought it was thorough.",
    "Please configure the PostgreSQL replica with synchronous commit disabled.",
    "The weather today is sunny with a light breeze from the west.",
    "She sells seashells by the seashore on sunny summer Sundays.",
    "The quick brown fox jumps over the lazy dog.",
    "Wojciech and Siobhan flew from Reykjavik to Ouagadougou in February.",
    "The sixth sick sheikh's sixth sheep is sick.",
    "Peter Piper picked a peck of pickled peppers.",
    "Kubernetes schedules pods onto nodes with enough allocatable resources.",
    "Anemone, synecdoche and onomatopoeia are rarely used words.",
    "The archaeologist catalogued the Mesopotamian cuneiform tablets meticulously.",
    "Worcestershire sauce is used in Caesar salad dressing.",
    "The bass player caught a bass while fishing near the bow of the boat.",
    "I scream, you scream, we all scream for ice cream.",
]


def tone_wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A valid 16-bit mono WAV of a 440 Hz tone (for tests that need audio, not speech)."""
    samples = (
        struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate)))
        for i in range(int(seconds * rate))
    )
    return wav(b"".join(samples), rate)


def noise_wav(seconds: float, rate: int = 96_000) -> bytes:
    """A valid 16-bit mono WAV of random samples: megabytes that play only seconds (29 s at
    96 kHz is 5.6 MB, under an engine's 30 s), base64 across every alphabet character."""
    return wav(os.urandom(int(seconds * rate) * 2), rate)


def require_tools() -> None:
    """Fail (never skip) without the Debian audio tools: `make system-deps` installs them."""
    missing = [t for t in ("espeak-ng", "sox", "ffmpeg") if not shutil.which(t)]
    if missing:
        raise RuntimeError(f"missing {', '.join(missing)}: run `make system-deps`")


@cache
def speak(text: str, directory: Path) -> Path:
    """A 16 kHz mono WAV of `text` spoken by espeak-ng."""
    require_tools()
    directory.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40]
    raw = directory / f"{slug}.espeak.wav"
    out = directory / f"{slug}.wav"
    if not out.exists():
        subprocess.run(["espeak-ng", "-s", "150", "-w", str(raw), text], check=True)
        # -R: sox's dither is seeded, so a sentence is the same file in every run (unseeded,
        # Whisper's text of the same sentence differed from run to run).
        subprocess.run(
            ["sox", "-R", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(out)], check=True
        )
    return out


FORMATS = {
    "wav": [],
    "flac": [],
    "mp3": ["-c:a", "libmp3lame", "-b:a", "64k"],
    "ogg": ["-c:a", "libvorbis"],
    "webm": ["-c:a", "libopus"],
    "m4a": ["-c:a", "aac", "-b:a", "64k"],
}


def convert(wav: Path, fmt: str) -> Path:
    """`wav` in another container (ffmpeg)."""
    require_tools()
    if fmt == "wav":
        return wav
    out = wav.with_suffix(f".{fmt}")
    if not out.exists():
        subprocess.run(
            ["ffmpeg", "-loglevel", "error", "-y", "-i", str(wav), *FORMATS[fmt], str(out)],
            check=True,
        )
    return out


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: word-level edit distance over the reference length."""
    ref, hyp = words(reference), words(hypothesis)
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i]
        for j, h in enumerate(hyp, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h)))
        prev = cur
    return prev[-1] / max(1, len(ref))
