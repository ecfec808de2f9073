"""Real test conversations for the speaker stage: espeak-ng voices taking turns, with the
reference (who spoke when) written as they are generated.

Each conversation is made from a `Spec`: its voices (espeak-ng voice, variant, pitch and
speed), how many turns, how long the gaps between them are, and the noise under it all. A
turn is one sentence of `testkit.audio`'s lists (or, in the hard set, half of one), spoken
by a voice other than the last one's; every voice speaks at least twice. The reference turn
is where the voice's samples rise above digital silence (espeak-ng's leading and trailing
silence left out). White noise is added to the whole file at `snr_db` below the speech's
level. Each voice also gets a reference clip (two sentences the conversation does not use,
2 to 10 s, with the same noise) for the known-speaker cases.

Files are cached under `directory/<spec name>-<digest>/` (the digest names the spec and this
module's source), so a changed recipe makes new ones:

    conversation.wav   16 kHz mono 16-bit
    reference.json     {"turns": [[start, end, speaker, text]...], "voices": {...}, ...}
    ref-<speaker>.wav  each voice's reference clip
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import subprocess
import tempfile
import wave
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from testkit.audio import HARD_SENTENCES, SENTENCES, require_tools

RATE = 16000
SILENCE = 1e-3  # |sample| above this is the voice (espeak-ng's padding is digital silence)
REFERENCE_S = (2.0, 10.0)
Floats = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Voice:
    voice: str  # espeak-ng's language voice, e.g. en-us
    variant: str  # espeak-ng's variant, e.g. m3 (`-v en-us+m3`)
    pitch: int  # 0-99
    speed: int  # words a minute

    @property
    def argv(self) -> list[str]:
        return ["-v", f"{self.voice}+{self.variant}", "-p", str(self.pitch), "-s", str(self.speed)]


@dataclass(frozen=True)
class Spec:
    name: str
    voices: tuple[Voice, ...]
    turns: int
    seed: int
    gap_s: tuple[float, float] = (0.4, 1.2)
    snr_db: float = 30.0
    short_turns: bool = False  # half sentences (the hard set)
    lead_s: float = 0.5  # silence before the first turn and after the last


@dataclass(frozen=True)
class Turn:
    start: float
    end: float
    speaker: str
    text: str


@dataclass(frozen=True)
class Conversation:
    spec: Spec
    wav: Path
    turns: list[Turn]
    references: dict[str, Path]  # speaker -> reference clip
    duration: float

    @property
    def speakers(self) -> list[str]:
        """Speaker labels in order of first turn."""
        return list(dict.fromkeys(t.speaker for t in self.turns))

    def speaker_at(self, start: float, end: float) -> str | None:
        """The reference speaker covering most of [start, end] (None: none does)."""
        best, most = None, 0.0
        for t in self.turns:
            overlap = min(end, t.end) - max(start, t.start)
            if overlap > most:
                best, most = t.speaker, overlap
        return best

    def turns_as_spans(self) -> list[tuple[float, float, str]]:
        return [(t.start, t.end, t.speaker) for t in self.turns]

    def timeline(self, step: float = 0.01) -> list[str | None]:
        """The reference speaker of each `step` of the file (None: silence)."""
        return timeline([(t.start, t.end, t.speaker) for t in self.turns], self.duration, step)


def timeline(
    turns: list[tuple[float, float, str]], duration: float, step: float = 0.01
) -> list[str | None]:
    out: list[str | None] = [None] * int(duration / step)
    for start, end, speaker in turns:
        for i in range(int(start / step), min(len(out), int(end / step))):
            out[i] = speaker
    return out


def agreement(
    conv: Conversation, turns: list[tuple[float, float, str]], mapped: bool = True
) -> float:
    """The share of the reference's speech time given its own speaker by `turns` (start,
    end, label): labels mapped to reference speakers one-to-one as best they can be
    (`mapped`), or taken as the reference's names (known speakers)."""
    ref = conv.timeline()
    hyp = timeline(turns, conv.duration)
    pairs = Counter((r, h) for r, h in zip(ref, hyp, strict=True) if r is not None)
    speech = sum(pairs.values())
    if not mapped:
        return sum(n for (r, h), n in pairs.items() if r == h) / speech
    labels = sorted({h for _, h in pairs if h is not None})
    speakers = sorted({r for r, _ in pairs if r is not None})
    best = 0
    for chosen in itertools.permutations(labels, min(len(labels), len(speakers))):
        for order in itertools.permutations(speakers, len(chosen)):
            m: dict[str | None, str] = dict(zip(chosen, order, strict=True))
            best = max(best, sum(n for (r, h), n in pairs.items() if m.get(h) == r))
    return best / speech


# --------------------------------------------------------------------------- the sets

# Voices that differ: variants, pitches and speeds chosen among 26 candidates so that no
# two are alike to CAM++ (the most similar pair's mean embeddings: cosine 0.45; one voice's
# own 3 s windows average about 0.8).
DISTINCT = [
    Voice("en-us", "m1", 50, 160),
    Voice("en-us", "f1", 70, 165),
    Voice("en-us", "klatt4", 60, 160),
    Voice("en-us", "Andy", 50, 150),
    Voice("en-us", "steph", 65, 160),
    Voice("en-us", "robert", 45, 150),
]
# Voices alike: male variants of one voice, pitches and speeds close together (their mean
# embeddings: cosine 0.7 to 0.9).
ALIKE = (
    Voice("en-us", "m1", 48, 155),
    Voice("en-us", "m2", 52, 150),
    Voice("en-us", "m3", 50, 160),
    Voice("en-us", "m4", 55, 155),
)


def _pick(count: int, k: int) -> tuple[Voice, ...]:
    """`count` distinct voices, a different choice for each k."""
    return tuple(DISTINCT[(k * 2 + i) % len(DISTINCT)] for i in range(count))


def specs(set_name: str, count: int = 3) -> list[Spec]:
    """The conversations of a set: `two`, `three`, `four` (distinct voices, light noise) or
    `hard` (four alike voices, short turns, 15 dB SNR)."""
    if set_name == "hard":
        return [
            Spec(f"hard-{k}", ALIKE, turns=14, seed=400 + k, snr_db=15.0, short_turns=True)
            for k in range(count)
        ]
    sizes = {"two": 2, "three": 3, "four": 4}
    if set_name not in sizes:
        raise ValueError(f"no conversation set {set_name!r}: two, three, four or hard")
    n = sizes[set_name]
    return [
        Spec(f"{set_name}-{k}", _pick(n, k), turns=4 * n, seed=100 * n + k) for k in range(count)
    ]


SETS = ("two", "three", "four", "hard")


def long_two() -> Spec:
    """Two distinct voices taking 14 turns (about a minute): long enough that the gateway
    cuts its transcript into chunks (`chunking_strategy`)."""
    return Spec("long-two", _pick(2, 0), turns=14, seed=735)


def conversation_set(set_name: str, directory: Path, count: int = 3) -> list[Conversation]:
    return [conversation(s, directory) for s in specs(set_name, count)]


# --------------------------------------------------------------------------- generation


def _digest(spec: Spec) -> str:
    source = Path(__file__).read_bytes()
    return hashlib.sha256(repr(asdict(spec)).encode() + source).hexdigest()[:10]


def _speak(voice: Voice, text: str, work: Path) -> Floats:
    """`text` in `voice` as 16 kHz float samples, espeak-ng's silence trimmed."""
    raw, out = work / "raw.wav", work / "out.wav"
    subprocess.run(["espeak-ng", *voice.argv, "-w", str(raw), text], check=True)
    # -R: sox's dither is seeded, so a spec makes the same file every time (unseeded, the
    # dither moved where a voice rises above silence, and with it every turn after).
    subprocess.run(
        ["sox", "-R", "-V1", str(raw), "-r", str(RATE), "-c", "1", "-b", "16", str(out),
         "vol", "0.8"],
        check=True,
    )  # fmt: skip
    samples = read_wav(out)
    loud = np.flatnonzero(np.abs(samples) > SILENCE)
    return samples[loud[0] : loud[-1] + 1] if loud.size else samples[:0]


def read_wav(path: Path) -> Floats:
    """A 16-bit mono WAV's samples in [-1, 1]."""
    with wave.open(str(path), "rb") as w:
        if w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise ValueError(f"{path}: not 16-bit mono")
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return (data.astype(np.float32) / 32768.0).astype(np.float32)


def write_wav(path: Path, samples: Floats) -> None:
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())


def _noisy(samples: Floats, snr_db: float, level: float, rng: np.random.Generator) -> Floats:
    noise = rng.standard_normal(samples.size) * level / (10 ** (snr_db / 20))
    return (samples + noise).astype(np.float32)


def _halves(sentence: str) -> list[str]:
    words = sentence.split()
    cut = len(words) // 2
    return [" ".join(words[:cut]), " ".join(words[cut:])]


def _lines(spec: Spec, rng: random.Random) -> list[tuple[int, str]]:
    """(voice index, text) per turn: no voice twice in a row, each at least twice."""
    pool = SENTENCES + HARD_SENTENCES
    texts = [h for s in pool for h in _halves(s)] if spec.short_turns else list(pool)
    rng.shuffle(texts)
    n = len(spec.voices)
    while True:
        order = [rng.randrange(n)]
        while len(order) < spec.turns:
            order.append(rng.choice([v for v in range(n) if v != order[-1]]))
        if all(order.count(v) >= 2 for v in range(n)):
            return list(zip(order, texts[: spec.turns], strict=True))


def _speaker(i: int) -> str:
    return f"S{i + 1}"


def conversation(spec: Spec, directory: Path) -> Conversation:
    """The conversation `spec` describes, generated once (cached)."""
    folder = directory / f"{spec.name}-{_digest(spec)}"
    meta = folder / "reference.json"
    if not meta.exists():
        _generate(spec, folder)
    doc = json.loads(meta.read_text())
    return Conversation(
        spec=spec,
        wav=folder / "conversation.wav",
        turns=[Turn(*t) for t in doc["turns"]],
        references={s: folder / f"ref-{s}.wav" for s in doc["voices"]},
        duration=doc["duration"],
    )


def _generate(spec: Spec, folder: Path) -> None:
    require_tools()
    rng = random.Random(spec.seed)
    noise_rng = np.random.default_rng(spec.seed)
    folder.mkdir(parents=True, exist_ok=True)
    lines = _lines(spec, rng)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        parts: list[Floats] = [np.zeros(int(spec.lead_s * RATE), dtype=np.float32)]
        at = spec.lead_s
        turns: list[Turn] = []
        for k, (v, text) in enumerate(lines):
            if k:
                gap = rng.uniform(*spec.gap_s)
                parts.append(np.zeros(int(gap * RATE), dtype=np.float32))
                at += int(gap * RATE) / RATE
            voice = _speak(spec.voices[v], text, work)
            turns.append(Turn(round(at, 3), round(at + voice.size / RATE, 3), _speaker(v), text))
            parts.append(voice)
            at += voice.size / RATE
        parts.append(np.zeros(int(spec.lead_s * RATE), dtype=np.float32))
        clean = np.concatenate(parts)
        speech = np.concatenate([p for p in parts if p.size and np.any(p)])
        level = float(np.sqrt(np.mean(speech**2)))
        write_wav(folder / "conversation.wav", _noisy(clean, spec.snr_db, level, noise_rng))
        used = {t for _, t in lines}
        unused = [s for s in SENTENCES + HARD_SENTENCES if s not in used]
        for v, voice_spec in enumerate(spec.voices):
            clip = _reference_clip(voice_spec, unused, v, work)
            write_wav(
                folder / f"ref-{_speaker(v)}.wav", _noisy(clip, spec.snr_db, level, noise_rng)
            )
    doc: dict[str, Any] = {
        "spec": asdict(spec),
        "duration": round(clean.size / RATE, 3),
        "turns": [[t.start, t.end, t.speaker, t.text] for t in turns],
        "voices": {_speaker(v): asdict(s) for v, s in enumerate(spec.voices)},
    }
    (folder / "reference.json").write_text(json.dumps(doc, indent=1) + "\n")


def _reference_clip(voice: Voice, unused: list[str], v: int, work: Path) -> Floats:
    """Two sentences the conversation does not use, 0.3 s apart, within 2-10 s."""
    texts = [unused[(2 * v) % len(unused)], unused[(2 * v + 1) % len(unused)]]
    gap = np.zeros(int(0.3 * RATE), dtype=np.float32)
    pad = np.zeros(int(0.2 * RATE), dtype=np.float32)
    clip = np.concatenate(
        [pad, _speak(voice, texts[0], work), gap, _speak(voice, texts[1], work), pad]
    )
    low, high = REFERENCE_S
    clip = clip[: int(high * RATE)]
    if clip.size < low * RATE:
        raise RuntimeError(f"{voice}: reference clip of {clip.size / RATE:.1f} s is too short")
    return clip


@dataclass(frozen=True)
class Summary:
    """What a set holds, for the benchmark's table."""

    files: int
    audio_s: float
    turns: int
    speakers: list[int] = field(default_factory=list)


def summary(conversations: list[Conversation]) -> Summary:
    return Summary(
        files=len(conversations),
        audio_s=round(sum(c.duration for c in conversations), 1),
        turns=sum(len(c.turns) for c in conversations),
        speakers=[len(c.speakers) for c in conversations],
    )


def right_share(conversation: Conversation, pieces: Sequence[Any], names: dict[str, str]) -> float:
    """The share of `pieces` (with `start`, `end` and `speaker`) whose speaker, mapped by
    `names` to the conversation's labels, is the one speaking most of that time."""
    said = [conversation.speaker_at(p.start, p.end) for p in pieces]
    right = sum(names.get(p.speaker) == who for p, who in zip(pieces, said, strict=True))
    return right / len(pieces) if pieces else 0.0
