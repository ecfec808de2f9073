"""faster-whisper's private API, as the worker uses it (transcription_worker's
faster_whisper_compat), against the installed faster-whisper: the version is the pinned
one; every private name, signature and attribute is there; the stand-in `self` of
`add_word_timestamps` gives what the real one does; segments split at timestamp tokens as
the transcriber expects. A new faster-whisper fails here, by name, before any transcript
changes."""

from __future__ import annotations

import copy
import inspect
import re
import tomllib
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from testkit.audio import SENTENCES, speak
from transcription_worker import faster_whisper_compat as compat
from transcription_worker.main import default_model
from transcription_worker.transcriber import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS

ROOT = Path(__file__).resolve().parents[1]


def pinned() -> str:
    """The one faster-whisper version the project names: the worker extra's exact pin."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [r for rs in project["optional-dependencies"].values() for r in rs
            if r.startswith("faster-whisper")]  # fmt: skip
    assert len(pins) == 1 and re.fullmatch(r"faster-whisper==[\d.]+", pins[0]), pins
    return pins[0].split("==")[1]


def test_the_installed_faster_whisper_is_the_pinned_one() -> None:
    assert version("faster-whisper") == pinned()


def signatures() -> dict[str, tuple[Callable[..., Any], str]]:
    """Each private callable the compat module reaches, and the parameters it passes
    (those after them must have defaults)."""
    from faster_whisper import WhisperModel
    from faster_whisper.audio import pad_or_trim
    from faster_whisper.tokenizer import Tokenizer
    from faster_whisper.transcribe import get_compression_ratio, get_suppressed_tokens
    from faster_whisper.utils import get_end
    from faster_whisper.vad import get_speech_timestamps

    model = WhisperModel
    return {
        "WhisperModel._split_segments_by_timestamps": (
            model._split_segments_by_timestamps,
            "self tokenizer tokens time_offset segment_size segment_duration seek",
        ),
        "WhisperModel.get_prompt": (model.get_prompt, "self tokenizer previous_tokens"),
        "WhisperModel.find_alignment": (
            model.find_alignment,
            "self tokenizer text_tokens encoder_output num_frames",
        ),
        "WhisperModel.add_word_timestamps": (
            model.add_word_timestamps,
            "self segments tokenizer encoder_output num_frames prepend_punctuations "
            "append_punctuations last_speech_timestamp",
        ),
        "WhisperModel.encode": (model.encode, "self features"),
        "audio.pad_or_trim": (pad_or_trim, "array"),
        "tokenizer.Tokenizer": (Tokenizer.__init__, "self tokenizer multilingual task language"),
        "transcribe.get_suppressed_tokens": (get_suppressed_tokens, "tokenizer suppress_tokens"),
        "transcribe.get_compression_ratio": (get_compression_ratio, "text"),
        "utils.get_end": (get_end, "segments"),
        "vad.get_speech_timestamps": (get_speech_timestamps, "audio vad_options"),
    }


@pytest.mark.parametrize("name", list(signatures()))
def test_each_private_callable_takes_what_the_compat_module_passes(name: str) -> None:
    function, names = signatures()[name]
    passed = names.split()
    parameters = list(inspect.signature(function).parameters.values())
    assert [p.name for p in parameters[: len(passed)]] == passed, name
    rest = [p for p in parameters[len(passed) :] if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    assert all(p.default is not p.empty for p in rest), (name, rest)


def test_the_stand_in_self_holds_all_add_word_timestamps_reads_of_self() -> None:
    from faster_whisper import WhisperModel

    source = inspect.getsource(WhisperModel.add_word_timestamps)
    read = set(re.findall(r"\bself\.(\w+)", source))
    stand_in = {n for n in vars(compat._Aligned) if not n.startswith("_")}
    stand_in |= set(vars(compat._Aligned([], 100)))
    assert read <= stand_in, read - stand_in


def test_the_other_private_names_are_there() -> None:
    import faster_whisper
    from faster_whisper.vad import VadOptions

    assert {"WhisperModel", "decode_audio", "download_model"} <= set(faster_whisper.__all__)
    assert "max_speech_duration_s" in inspect.signature(VadOptions).parameters
    codes = compat.language_codes()
    assert {"en", "de", "zh", "yue"} <= codes and len(codes) >= 99


@pytest.fixture(scope="module")
def internals() -> compat.Internals:
    from faster_whisper import WhisperModel

    model = WhisperModel(default_model(), device="cpu", compute_type="int8", cpu_threads=2)
    return compat.Internals(model)  # reads the undocumented attributes: a missing one fails


def test_the_attributes_read_from_a_loaded_model(internals: compat.Internals) -> None:
    assert (internals.max_length, internals.time_precision) == (448, 0.02)
    assert (internals.frames_per_second, internals.time_per_frame) == (100, 0.01)
    assert internals.multilingual is False  # tiny.en
    features = internals.features(np.zeros(16000, dtype=np.float32))
    assert features.shape == (80, 101)  # one frame more than whole, as the transcriber counts
    padded = compat.pad_or_trim(features)
    assert padded.shape == (80, 3000)
    assert internals.encode(padded[None]).shape == [1, 1500, 384]


def test_segments_split_at_timestamp_tokens(internals: compat.Internals) -> None:
    tok = internals.tokenizer("transcribe", "en")
    ts = tok.timestamp_begin
    hello, world = tok.encode(" Hello."), tok.encode(" World.")
    # Two finished segments, closed by a single timestamp: the whole 15 s (1500 frames) done.
    tokens = [ts, *hello, ts + 50, ts + 50, *world, ts + 100]
    segments, seek, single = internals.split_segments(tok, tokens, 3.0, 1500, 300)
    assert [(s["start"], s["end"], s["tokens"]) for s in segments] == [
        (3.0, 4.0, [ts, *hello, ts + 50]), (4.0, 5.0, [ts + 50, *world, ts + 100]),
    ]  # fmt: skip
    assert (seek, single) == (1800, True)
    # The last segment cut off: the window goes on from its start (timestamp 50: 100 frames).
    segments, seek, single = internals.split_segments(tok, tokens[:-1], 3.0, 1500, 300)
    assert [s["tokens"] for s in segments] == [[ts, *hello, ts + 50]]
    assert (seek, single) == (400, False)
    assert internals.prompt(tok, [1, 2]) == [tok.sot_prev, 1, 2, *tok.sot_sequence]
    suppressed = compat.suppressed_tokens(tok)
    assert {tok.sot, tok.sot_prev, tok.transcribe, tok.no_speech} <= set(suppressed)
    assert not {*hello, *world} & set(suppressed)


def test_the_stand_in_self_aligns_words_as_the_model_does(
    internals: compat.Internals, tmp_path: Path
) -> None:
    from faster_whisper import decode_audio

    audio = decode_audio(str(speak(SENTENCES[0], tmp_path)), sampling_rate=16000)
    features = internals.features(audio)
    frames = features.shape[-1] - 1
    encoded = internals.encode(compat.pad_or_trim(features)[None])
    tok = internals.tokenizer("transcribe", "en")
    text = list(tok.encode(" " + SENTENCES[0]))
    end = tok.timestamp_begin + round(frames / 2)
    segments = [{"seek": 0, "start": 0.0, "end": frames / 100, "tokens": [tok.timestamp_begin,
                 *text, end]}]  # fmt: skip

    real = copy.deepcopy(segments)
    internals.whisper.add_word_timestamps(
        [real], tok, encoded, frames, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS, 0.0
    )
    [alignment] = internals.find_alignment(tok, [text], encoded, [frames])
    internals.add_word_timestamps(
        alignment, segments, tok, encoded, frames, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS, 0.0
    )
    assert segments == real
    words = segments[0]["words"]
    assert "".join(w["word"] for w in words).strip() == SENTENCES[0]
    assert all(0 <= w["start"] <= w["end"] <= frames / 100 for w in words)
    assert compat.last_word_end(segments) == words[-1]["end"]


def test_speech_timestamps_find_the_sentence(tmp_path: Path) -> None:
    from faster_whisper import decode_audio

    speech = decode_audio(str(speak(SENTENCES[1], tmp_path)), sampling_rate=16000)
    silence = np.zeros(16000, dtype=np.float32)
    audio = np.concatenate([silence, speech, silence])
    ranges = compat.speech_timestamps(audio, 30)
    # after the second of silence, less Silero's padding (0.4 s); within the audio
    assert ranges and 16000 - 0.4 * 16000 <= ranges[0][0] < 2 * 16000
    assert ranges[-1][1] <= audio.size and sum(b - a for a, b in ranges) > 0.8 * speech.size
    assert compat.compression_ratio("la " * 50) > 2.4 > compat.compression_ratio(SENTENCES[1])
