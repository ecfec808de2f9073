"""The speaker stage's pure parts: features, speech regions, windows, clustering, turns,
known-speaker checks and matching, and the labels ASR segments and words get; plus label
assignment on embeddings recorded from a real two-voice conversation (no model needed)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from transcription_api import diarization as assign
from transcription_api.diarization import Turn
from transcription_worker.speakers import cluster, fbank, known, turns, vad
from transcription_worker.speakers.known import SpeakerInputError
from transcription_worker.speakers.pipeline import _samples

RECORDED = Path(__file__).parent / "fixtures" / "speakers" / "two-voices.npz"
RATE = 16000


# --------------------------------------------------------------------------- fbank


def test_fbank_frames_as_kaldi_counts_them() -> None:
    assert fbank.frame_count(399) == 0
    assert fbank.frame_count(400) == 1
    assert fbank.frame_count(RATE) == 98  # 1 + (16000 - 400) // 160
    assert fbank.log_mel(np.zeros(100, dtype=np.float32)).shape == (0, 80)


def test_fbank_features_are_mean_normalized_and_a_tone_lands_in_its_band() -> None:
    t = np.arange(RATE) / RATE
    low = fbank.log_mel(0.5 * np.sin(2 * np.pi * 300 * t)).mean(axis=0)
    high = fbank.log_mel(0.5 * np.sin(2 * np.pi * 3000 * t)).mean(axis=0)
    assert int(np.argmax(low)) < 20 < int(np.argmax(high))
    feats = fbank.features(0.1 * np.sin(2 * np.pi * 500 * t))
    assert feats.shape == (98, 80)
    assert np.allclose(feats.mean(axis=0), 0, atol=1e-4)
    assert fbank.features(np.zeros(10, dtype=np.float32)).shape == (1, 80)  # padded to a frame


def test_fbank_pad_batches_windows_of_different_lengths() -> None:
    batch = fbank.pad([np.ones((3, 80), np.float32), np.ones((5, 80), np.float32)])
    assert batch.shape == (2, 5, 80)
    assert batch[0, 3:].sum() == 0
    assert fbank.pad([]).shape == (0, 1, 80)


# --------------------------------------------------------------------------- VAD regions


def frames(pattern: str) -> np.ndarray:
    """Probabilities from a pattern: '#' speech (0.9), '.' silence (0.05), '-' in between."""
    return np.array([{"#": 0.9, ".": 0.05, "-": 0.4}[c] for c in pattern], dtype=np.float32)


def test_vad_regions_follow_silero_rules() -> None:
    s = vad.VadSettings(threshold=0.5, min_speech_ms=250, min_silence_ms=100, pad_ms=0)
    # 10 frames of speech (320 ms), 5 of silence (160 ms), 10 of speech.
    probs = frames("#" * 10 + "." * 5 + "#" * 10 + "." * 10)
    assert vad.regions(probs, s) == [(0.0, 0.32), (0.48, 0.8)]
    # A gap shorter than min_silence_ms is bridged; '-' (between the thresholds) keeps speech.
    assert vad.regions(frames("#" * 10 + ".." + "#" * 10 + "-" * 3 + "#" * 5 + "." * 5), s) == [
        (0.0, 0.96)
    ]
    # Speech shorter than min_speech_ms is dropped.
    assert vad.regions(frames("###" + "." * 10), s) == []
    # Padding widens regions, never past the file or halfway to a neighbour.
    padded = vad.regions(probs, vad.VadSettings(pad_ms=200), total_s=1.12)
    assert padded == [(0.0, 0.4), (0.4, 1.0)]


# --------------------------------------------------------------------------- windows, turns


def test_windows_slide_over_each_region_and_end_with_it() -> None:
    assert turns.windows([(0.0, 3.0)], 1.5, 0.75) == [(0.0, 1.5), (0.75, 2.25), (1.5, 3.0)]
    assert turns.windows([(1.0, 1.4)]) == [(1.0, 1.4)]  # shorter than a window: one window
    assert turns.windows([(0.0, 2.0)], 1.5, 0.75) == [(0.0, 1.5), (0.5, 2.0)]
    with pytest.raises(ValueError, match="ends before it starts"):
        turns.windows([(2.0, 1.0)])
    with pytest.raises(ValueError, match="positive"):
        turns.windows([(0.0, 1.0)], 1.5, 0)


def test_letters_name_speakers_in_order() -> None:
    assert [turns.letter(i) for i in (0, 1, 25, 26, 27)] == ["A", "B", "Z", "AA", "AB"]
    assert turns.speaker_names(np.array([2, 2, 0, 1, 0])) == ["A", "A", "B", "C", "B"]
    # A known name that is a letter is not given to an unnamed speaker too.
    assert turns.speaker_names(np.array([0, 1, 2]), {1: "A"}) == ["B", "A", "C"]


def test_turns_change_halfway_between_disagreeing_windows() -> None:
    spans = [(0.0, 1.5), (0.75, 2.25), (1.5, 3.0)]
    made = turns.make_turns([(0.0, 3.0)], spans, ["A", "A", "B"])
    # Centres 0.75, 1.5, 2.25: B from 1.875 on.
    assert [(t.speaker, t.start, t.end) for t in made] == [("A", 0.0, 1.88), ("B", 1.88, 3.0)]


def test_turns_never_cover_silence_and_short_runs_join_a_neighbour() -> None:
    regions = [(0.0, 1.0), (2.0, 4.0)]
    spans = [(0.0, 1.0), (2.0, 3.0), (2.55, 2.65), (2.5, 4.0)]
    # The window centred at 2.6 makes a 0.375 s run of C: it goes to its longer neighbour.
    made = turns.make_turns(regions, spans, ["A", "B", "C", "B"], min_turn=0.5)
    assert [(t.speaker, t.start, t.end) for t in made] == [("A", 0.0, 1.0), ("B", 2.0, 4.0)]
    with pytest.raises(ValueError, match="2 windows but 1 speakers"):
        turns.make_turns(regions, spans[:2], ["A"])


# --------------------------------------------------------------------------- clustering


def naive_average_linkage(x: np.ndarray, threshold: float) -> list[int]:
    """The textbook loop: join the most similar pair of groups while it reaches threshold."""
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    groups = [[i] for i in range(len(x))]
    while len(groups) > 1:
        best, pair = -np.inf, (0, 0)
        for a, b in itertools.combinations(range(len(groups)), 2):
            s = float(np.mean(x[groups[a]] @ x[groups[b]].T))
            if s > best:
                best, pair = s, (a, b)
        if best < threshold:
            break
        a, b = pair
        groups[a] += groups.pop(b)
    label = {i: g for g, members in enumerate(groups) for i in members}
    order: dict[int, int] = {}
    return [order.setdefault(label[i], len(order)) for i in range(len(x))]


@pytest.mark.parametrize("seed", range(6))
def test_nearest_neighbour_chain_gives_the_textbook_groups(seed: int) -> None:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((4, 16))
    x = np.concatenate([c + rng.standard_normal((6, 16)) for c in centres])[rng.permutation(24)]
    for threshold in (0.0, 0.2, 0.4):
        assert cluster.average_linkage(x, threshold).tolist() == naive_average_linkage(x, threshold)


def test_clustering_finds_the_speaker_count_and_absorbs_stray_windows() -> None:
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((3, 192))
    x = np.concatenate([c + 0.8 * rng.standard_normal((20, 192)) for c in centres])
    labels = cluster.cluster(x)
    assert labels.tolist() == [0] * 20 + [1] * 20 + [2] * 20
    # One stray window (a cough, two voices at once) joins the group it is most like.
    stray = centres[1] + 3 * rng.standard_normal(192)
    with_stray = cluster.cluster(np.vstack([x, stray]), min_size=3)
    assert with_stray.max() == 2
    assert cluster.cluster(x[:1]).tolist() == [0]
    assert cluster.cluster(np.zeros((0, 192))).tolist() == []


def test_clustering_refuses_bad_embeddings() -> None:
    with pytest.raises(ValueError, match="windows, dimensions"):
        cluster.cluster(np.zeros(5))
    with pytest.raises(ValueError, match="finite"):
        cluster.cluster(np.full((3, 4), np.nan))
    with pytest.raises(ValueError, match="3 embeddings but 2 labels"):
        cluster.absorb_small(np.ones((3, 4)), np.array([0, 1]))


# --------------------------------------------------------------------------- known speakers


def clip(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), dtype=np.float32)


@pytest.mark.parametrize(
    ("names", "clips", "param", "message"),
    [
        (["a", "b"], [clip(3)], "known_speaker_names", "2 known_speaker_names but 1"),
        (["a"], [clip(3), clip(3)], "known_speaker_references", "1 known_speaker_names but 2"),
        (list("abcde"), [clip(3)] * 5, "known_speaker_names", "at most 4"),
        (["a", " "], [clip(3)] * 2, "known_speaker_names", r"known_speaker_names\[1\] is empty"),
        (["a", "a"], [clip(3)] * 2, "known_speaker_names", "given twice"),
        (["a"], [clip(1.5)], "known_speaker_references", r"1.50 s long.*2 to 10 s"),
        (["a"], [clip(10.5)], "known_speaker_references", r"10.50 s long"),
        (["a"], [np.zeros((2, 3 * RATE))], "known_speaker_references", "mono"),
        (["a"], [np.full(3 * RATE, np.nan)], "known_speaker_references", "not numbers"),
    ],
)
def test_bad_known_speakers_name_their_field(
    names: list[str], clips: list[np.ndarray], param: str, message: str
) -> None:
    with pytest.raises(SpeakerInputError, match=message) as err:
        known.references(names, clips)
    assert err.value.param == param


def test_good_references_are_kept_in_order() -> None:
    refs = known.references(["Ann", "Bob "], [clip(2), clip(10)])
    assert [r.name for r in refs] == ["Ann", "Bob"]


def test_known_names_go_one_to_one_to_groups_above_the_threshold() -> None:
    e = np.eye(4)
    centroids = np.array([e[0], e[1], 0.9 * e[0] + 0.1 * e[2], e[3]])
    refs = np.array([e[0], e[1], e[2]])
    # Group 0 and group 2 both resemble Ann: the closer one (0) gets the name.
    assert known.match(centroids, refs, ["Ann", "Bob", "Cy"], 0.7) == {0: "Ann", 1: "Bob"}
    assert known.match(centroids, refs, ["Ann", "Bob", "Cy"], 1.01) == {}
    assert known.match(np.zeros((0, 4)), refs, ["Ann", "Bob", "Cy"]) == {}
    with pytest.raises(ValueError, match="3 reference embeddings but 2 names"):
        known.match(centroids, refs, ["Ann", "Bob"])


# --------------------------------------------------------------------------- labels


@dataclass(frozen=True)
class Piece:
    start: float
    end: float
    text: str = ""


TURNS = [Turn(0.0, 2.0, "A"), Turn(2.0, 3.0, "B"), Turn(4.0, 6.0, "A")]


def test_a_piece_gets_the_speaker_covering_most_of_it() -> None:
    assert assign.speaker_of(1.5, 2.4, TURNS) == "A"  # 0.5 s of A, 0.4 s of B
    assert assign.speaker_of(1.9, 2.9, TURNS) == "B"
    assert assign.speaker_of(3.2, 3.4, TURNS) == "B"  # in silence: the nearest turn
    assert assign.speaker_of(3.7, 3.9, TURNS) == "A"
    assert assign.speaker_of(0.0, 1.0, []) is None
    assert assign.label([Piece(0, 1)], []) == ["A"]
    with pytest.raises(ValueError, match="ends"):
        assign.speaker_of(2.0, 1.0, TURNS)


def test_words_split_a_shared_segment_where_the_speaker_changes() -> None:
    words = [Piece(0.2, 0.5, " Hello"), Piece(0.6, 1.0, " there."), Piece(2.1, 2.5, " Hi"),
             Piece(2.5, 2.9, " back."), Piece(4.2, 4.6, " Bye.")]  # fmt: skip
    out = assign.by_words(words, TURNS)
    assert [(s.speaker, s.start, s.end, s.text) for s in out] == [
        ("A", 0.2, 1.0, "Hello there."),
        ("B", 2.1, 2.9, "Hi back."),
        ("A", 4.2, 4.6, "Bye."),
    ]
    segments = assign.by_segments([Piece(0.0, 2.6, "Hello there. Hi")], TURNS)
    assert [(s.speaker, s.text) for s in segments] == [("A", "Hello there. Hi")]


def test_audio_must_be_mono_and_numbers() -> None:
    with pytest.raises(ValueError, match="mono"):
        _samples(np.zeros((2, 100), np.float32))
    with pytest.raises(ValueError, match="16-bit"):
        _samples(np.zeros(100, np.int32))
    with pytest.raises(ValueError, match="not numbers"):
        _samples(np.array([0.0, np.inf], np.float32))
    assert _samples(np.array([16384], np.int16)).tolist() == [0.5]


# --------------------------------------------------------------------------- recorded


def test_labels_from_recorded_embeddings_of_a_two_voice_conversation() -> None:
    """Embeddings CAM++ gave for the windows of testkit's `two-0` conversation (recorded by
    `python -m testkit.speaker_model record`): clustering, turns and word labels give each
    reference turn's words its speaker."""
    rec = np.load(RECORDED)
    speech = [tuple(r) for r in rec["speech"].tolist()]
    spans = [tuple(w) for w in rec["windows"].tolist()]
    groups = cluster.cluster(rec["embeddings"])
    assert groups.max() == 1
    made = turns.make_turns(speech, spans, turns.speaker_names(groups))
    reference = [Turn(float(a), float(b), str(s)) for (a, b), s in
                 zip(rec["turns"].tolist(), rec["speakers"].tolist(), strict=True)]  # fmt: skip
    # Which letter is which voice: the one covering the first reference turn is S1's.
    first = assign.speaker_of(reference[0].start, reference[0].end, made)
    mapping = {first: reference[0].speaker}
    mapping.update({s: "S2" if reference[0].speaker == "S1" else "S1" for s in "AB" if s != first})
    pieces = [Piece(t.start + 0.1, t.end - 0.1) for t in reference]
    assert [mapping[s] for s in assign.label(pieces, made)] == [t.speaker for t in reference]
