"""faster-whisper's private API, in one place.

The transcriber runs faster-whisper's own algorithm on batches of windows, which its public
API (`WhisperModel.transcribe`, `decode_audio`, `download_model`) does not offer. What it
needs beyond that lives here: a private method, undocumented methods and attributes of a
loaded `WhisperModel` (`Internals`; one method is called with a stand-in `self`), helpers
of its submodules and a private table. Any release may change them, so the version is
pinned exactly (the project's `worker` extra, which the frontend image reads for its Silero
model too), and this module's own test checks every name, signature and attribute used
here against the installed version, and that the stand-in `self` gives what the real one
does.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

Features = np.ndarray[Any, np.dtype[np.float32]]
# faster-whisper's segment dicts: seek, start, end, tokens (and words, once aligned).
Segments = list[dict[str, Any]]


class Internals:
    """What the transcriber uses of a loaded `WhisperModel` beyond its public API. Its
    attributes are read here, once: a release that drops one fails at start-up."""

    def __init__(self, model: Any) -> None:
        self.whisper = model
        self.max_length: int = model.max_length  # the decoder's context, in tokens
        self.time_precision: float = model.time_precision  # seconds a timestamp token counts
        self.frames_per_second: int = model.frames_per_second  # mel frames
        self.time_per_frame: float = model.feature_extractor.time_per_frame
        self.multilingual = bool(model.model.is_multilingual)

    @property
    def ctranslate2(self) -> Any:
        """CTranslate2's Whisper model (its public API: encode, generate, align,
        detect_language), read at each use."""
        return self.whisper.model

    def features(self, audio: Features) -> Features:
        """The log-mel spectrogram of 16 kHz audio (80 x frames, one more than whole)."""
        return np.asarray(self.whisper.feature_extractor(audio))

    def encode(self, features: Features) -> Any:
        """The encoder's output (a CTranslate2 StorageView) for a batch of 30 s features."""
        return self.whisper.encode(features)

    def tokenizer(self, task: str, language: str) -> Any:
        """faster-whisper's Whisper tokenizer for the task and language."""
        from faster_whisper.tokenizer import Tokenizer

        return Tokenizer(self.whisper.hf_tokenizer, self.multilingual, task=task, language=language)

    def prompt(self, tokenizer: Any, previous_tokens: list[int]) -> list[int]:
        """The decoder's prompt: the previous text's tokens (at most half the context),
        then the start sequence."""
        return list(self.whisper.get_prompt(tokenizer, previous_tokens))

    def split_segments(
        self, tokenizer: Any, tokens: list[int], time_offset: float, frames: int, seek: int
    ) -> tuple[Segments, int, bool]:
        """One decoded window's tokens cut into segments at its timestamp tokens (times from
        `time_offset`; its `frames` mel frames start at `seek`): the segments, the next seek
        (after the last complete segment), and whether the tokens end on a single
        timestamp."""
        segments, next_seek, single_timestamp_ending = self.whisper._split_segments_by_timestamps(
            tokenizer=tokenizer,
            tokens=tokens,
            time_offset=time_offset,
            segment_size=frames,
            segment_duration=frames * self.time_per_frame,
            seek=seek,
        )
        return segments, next_seek, single_timestamp_ending

    def find_alignment(
        self, tokenizer: Any, text_tokens: list[list[int]], encoded: Any, frames: list[int]
    ) -> list[list[dict[str, Any]]]:
        """Word timings of each window's text tokens from cross-attention (one CTranslate2
        `align` call for the batch): a list of word dicts per window."""
        return list(self.whisper.find_alignment(tokenizer, text_tokens, encoded, frames))

    def add_word_timestamps(
        self,
        alignment: list[dict[str, Any]],
        segments: Segments,
        tokenizer: Any,
        encoded: Any,
        frames: int,
        prepend_punctuations: str,
        append_punctuations: str,
        last_speech: float,
    ) -> None:
        """Set `words` on one window's segments from its share of a batch's `alignment`,
        with faster-whisper's heuristics (punctuation merged, over-long words at pauses and
        segment edges cut). faster-whisper aligns inside that method; it is called on a
        stand-in `self` that hands it the alignment already made."""
        from faster_whisper import WhisperModel

        WhisperModel.add_word_timestamps(
            _Aligned(alignment, self.frames_per_second),
            [segments],
            tokenizer,
            encoded,
            frames,
            prepend_punctuations,
            append_punctuations,
            last_speech,
        )


class _Aligned:
    """The `self` of `WhisperModel.add_word_timestamps`: what the method reads of it."""

    def __init__(self, alignment: list[dict[str, Any]], frames_per_second: int) -> None:
        self.alignment = alignment
        self.frames_per_second = frames_per_second

    def find_alignment(self, *_: Any) -> list[list[dict[str, Any]]]:
        return [self.alignment]


def pad_or_trim(features: Features) -> Features:
    """Mel frames padded or cut to Whisper's 30 s input (3000 frames)."""
    from faster_whisper.audio import pad_or_trim as pad

    return np.asarray(pad(features))


@functools.cache
def language_codes() -> frozenset[str]:
    """The language codes Whisper knows."""
    from faster_whisper.tokenizer import _LANGUAGE_CODES

    return frozenset(_LANGUAGE_CODES)


def suppressed_tokens(tokenizer: Any) -> list[int]:
    """The tokens decoding never emits: non-speech symbols and the special tokens
    (faster-whisper's default `suppress_tokens=[-1]`)."""
    from faster_whisper.transcribe import get_suppressed_tokens

    return list(get_suppressed_tokens(tokenizer, [-1]))


def compression_ratio(text: str) -> float:
    """How well `text` compresses (zlib): above 2.4, the temperature fallback calls it a
    repetition loop."""
    from faster_whisper.transcribe import get_compression_ratio

    return float(get_compression_ratio(text))


def last_word_end(segments: Segments) -> float | None:
    """When the last word of the segments ends (None without words)."""
    from faster_whisper.utils import get_end

    end = get_end(segments)
    return None if end is None else float(end)


def speech_timestamps(audio: Features, max_speech_seconds: float) -> list[tuple[int, int]]:
    """Where Silero VAD finds speech in 16 kHz audio (faster-whisper's VAD at its default
    settings), as sample ranges, speech longer than `max_speech_seconds` cut at its last
    pause."""
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    speech = get_speech_timestamps(audio, VadOptions(max_speech_duration_s=max_speech_seconds))
    return [(int(c["start"]), int(c["end"])) for c in speech]
