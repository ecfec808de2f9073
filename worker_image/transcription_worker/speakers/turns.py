"""Speaker turns: the windows embeddings are taken over, and the turns their labels make.

Within each stretch of speech, windows of `WINDOW_S` start every `SHIFT_S`, the last one
ending where the speech ends (a stretch shorter than a window is one window). Once each
window has a speaker, every 10 ms of speech belongs to the window whose centre is nearest
(so a change of speaker falls halfway between the centres of two windows that disagree);
runs of the same speaker are turns. A turn shorter than `MIN_TURN_S` inside a stretch of
speech is given to its longer neighbour there. Silence between stretches stays silence:
turns never cover it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from transcription_api.diarization import Turn

WINDOW_S = 1.5
SHIFT_S = 0.75
MIN_TURN_S = 0.3
STEP_S = 0.01

Span = tuple[float, float]


def windows(
    regions: Sequence[Span], length: float = WINDOW_S, shift: float = SHIFT_S
) -> list[Span]:
    """The (start, end) seconds of the windows over stretches of speech `regions`."""
    if length <= 0 or shift <= 0:
        raise ValueError("window length and shift must be positive")
    out: list[Span] = []
    for start, end in regions:
        if end <= start:
            raise ValueError(f"speech region ({start}, {end}) ends before it starts")
        at = start
        while at + length < end:
            out.append((round(at, 3), round(at + length, 3)))
            at += shift
        out.append((round(max(start, end - length), 3), round(end, 3)))
    return out


def letter(index: int) -> str:
    """A, B, ..., Z, AA, AB, ...: the name of the index-th speaker found."""
    name = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        name = chr(ord("A") + rest) + name
    return name


def make_turns(
    regions: Sequence[Span],
    spans: Sequence[Span],
    speakers: Sequence[str],
    min_turn: float = MIN_TURN_S,
) -> list[Turn]:
    """Turns from windows `spans` (inside `regions`) and each window's speaker."""
    if len(spans) != len(speakers):
        raise ValueError(f"{len(spans)} windows but {len(speakers)} speakers")
    centres = np.array([(a + b) / 2 for a, b in spans], dtype=np.float64)
    out: list[Turn] = []
    for start, end in regions:
        inside = [i for i, (a, b) in enumerate(spans) if a < end and b > start]
        if not inside:
            continue
        steps = np.arange(start, end, STEP_S) + STEP_S / 2
        nearest = np.abs(steps[:, None] - centres[inside][None, :]).argmin(axis=1)
        labels = [speakers[inside[k]] for k in nearest.tolist()]
        out += _smoothed(_runs(labels, start, end), min_turn)
    return out


def _runs(labels: Sequence[str], start: float, end: float) -> list[Turn]:
    runs: list[Turn] = []
    begin = 0
    for i in range(1, len(labels) + 1):
        if i == len(labels) or labels[i] != labels[begin]:
            a = start + begin * STEP_S
            b = min(end, start + i * STEP_S)
            runs.append(Turn(round(a, 3), round(b, 3), labels[begin]))
            begin = i
    return runs


def _smoothed(runs: list[Turn], min_turn: float) -> list[Turn]:
    """Runs shorter than `min_turn` given to their longer neighbour, neighbours of the same
    speaker joined."""
    runs = list(runs)
    while len(runs) > 1:
        short = [i for i, r in enumerate(runs) if r.duration < min_turn]
        if not short:
            break
        i = min(short, key=lambda k: runs[k].duration)
        left = runs[i - 1] if i > 0 else None
        right = runs[i + 1] if i + 1 < len(runs) else None
        take = (
            left
            if right is None or (left is not None and left.duration >= right.duration)
            else right
        )
        assert take is not None
        runs[i] = Turn(runs[i].start, runs[i].end, take.speaker)
        runs = _joined(runs)
    return runs


def _joined(runs: list[Turn]) -> list[Turn]:
    out: list[Turn] = []
    for r in runs:
        if out and out[-1].speaker == r.speaker and abs(out[-1].end - r.start) < 1e-6:
            out[-1] = Turn(out[-1].start, r.end, r.speaker)
        else:
            out.append(r)
    return out


def speaker_names(labels: npt.NDArray[np.int64], names: dict[int, str] | None = None) -> list[str]:
    """Each window's speaker name: `names` for the groups that have one, the others letters
    in order of first appearance (A for the first unnamed group; a letter that is one of
    `names` is skipped)."""
    names = names or {}
    taken = set(names.values())
    letters: dict[int, str] = {}
    out = []
    for g in labels.tolist():
        if g in names:
            out.append(names[g])
            continue
        if g not in letters:
            k = len(letters)
            while letter(k) in taken or letter(k) in letters.values():
                k += 1
            letters[g] = letter(k)
        out.append(letters[g])
    return out
