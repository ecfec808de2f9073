"""faster-whisper, batched: the model and one batch step.

A request's audio becomes *windows* of at most 30 s (`windows`). The lane (`batcher`)
gathers windows of every request in flight into one batch, and `Transcriber.step` decodes
that batch with one CTranslate2 encoder call and one decoder call.
What happens to each window is faster-whisper's own sequential algorithm, applied to a
batch: temperature fallback (OpenAI's meaning of `temperature=0`), the no-speech skip,
splitting at timestamp tokens, continuing a window whose last segment was cut off, and word
timestamps from cross-attention alignment -- so a request decodes to the same text it would
alone. Each temperature of the fallback is a step of its own: a window whose text looks
wrong goes back to the batcher with its attempts so far and the next temperature, so the
batcher can decode an interactive request's window between two rounds of a long one.

What this takes of faster-whisper beyond its public API goes through
`faster_whisper_compat`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from . import faster_whisper_compat as compat
from .device import DeviceError, check_gpus, cpu_count, unusable
from .windows import SAMPLE_RATE, Audio, TimeMap, speech_windows, split_on_silence

WINDOW_FRAMES = 3000  # Whisper's 30 s encoder input, in mel frames
MAX_LENGTH = 448  # Whisper's decoder context, in tokens
# faster-whisper's defaults for the temperature fallback and the no-speech skip.
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
COMPRESSION_RATIO_THRESHOLD = 2.4
LOG_PROB_THRESHOLD = -1.0
NO_SPEECH_THRESHOLD = 0.6
BEST_OF = 5
MAX_INITIAL_TIMESTAMP = 1.0  # seconds
# faster-whisper's defaults for merging punctuation into words (fullwidth forms included).
PREPEND_PUNCTUATIONS = "\"'\u201c\u00bf([{-"
APPEND_PUNCTUATIONS = "\"'.\u3002,\uff0c!\uff01?\uff1f:\uff1a\u201d)]}\u3001"


class AudioError(ValueError):
    """The upload cannot be decoded as audio."""


def decode(file: IO[bytes]) -> Audio:
    """Decode any container PyAV/ffmpeg reads into 16 kHz mono float32 samples."""
    from faster_whisper import decode_audio

    try:
        audio = decode_audio(file, sampling_rate=SAMPLE_RATE)
    except Exception as e:  # PyAV raises many error types for bad input
        raise AudioError(
            "Invalid or corrupted audio data. Ensure the input is a valid audio or video file "
            "(e.g. a complete WAV, MP3, FLAC, OGG, WebM or M4A)."
        ) from e
    if audio.size == 0:
        raise AudioError("The audio contains no samples.")
    return np.asarray(audio, dtype=np.float32)


@dataclass(frozen=True)
class Options:
    """What one request asks for."""

    task: str = "transcribe"  # or "translate"
    language: str | None = None
    languages: tuple[str, ...] = ()  # no language given: detect among these (all if empty)
    prompt: str | None = None
    temperature: float = 0.0
    words: bool = False
    logprobs: bool = False  # each text token's log probability (`include[]=logprobs`)

    @property
    def temperatures(self) -> tuple[float, ...]:
        """0 means: start greedy/beam and fall back to sampling while the text looks wrong."""
        return FALLBACK_TEMPERATURES if self.temperature == 0 else (self.temperature,)


@dataclass(frozen=True)
class Decoding:
    """Pool-wide decoding settings (the pool's spec, through the operator's settings)."""

    beam_size: int = 5
    vad_filter: bool = False
    max_batch_size: int = 8


@dataclass
class Segment:
    id: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[tuple[str, float, float]] = field(default_factory=list)
    logprobs: list[tuple[str, float]] = field(default_factory=list)  # (token text, log p)


# One decoding of a window at one temperature: CTranslate2's result, its average log
# probability, the temperature, its compression ratio.
Attempt = tuple[Any, float, float, float]

# One window's decoded step: faster-whisper's segment dicts, the next seek, and whether the
# last segment ends on a single timestamp; None for silence.
Split = tuple[list[dict[str, Any]], int, bool] | None


@dataclass(eq=False)
class Window:
    """Up to 30 s of one request's audio, and how far its decoding has got.

    A window is decoded in *steps*: each step decodes the 30 s that start at `seek`; when
    the model's last segment in it is unfinished, `seek` moves to the last timestamp and the
    window goes back to the batcher for another step (faster-whisper's seek loop). A step
    whose text looks wrong (temperature fallback) is tried again at the next temperature in
    a step of its own: `fallback` is that temperature's index, `attempts` the tries so far at
    this `seek`, and on the CPU `encoded` keeps the encoder output for the next round.
    """

    audio: Audio  # the request's whole audio; the window reads `ranges` of it
    ranges: list[tuple[int, int]]  # sample ranges of the request's audio (speech when VAD is on)
    options: Options
    index: int = 0
    prompt: list[int] = field(default_factory=list)  # the request's prompt, as tokens
    seek: int = 0  # mel frames of the window already decoded
    language: str | None = None  # given, or detected on the window's first step
    last_speech: float = 0.0  # end of the last word (word timestamps' heuristics)
    segments: list[Segment] = field(default_factory=list)  # decoded, not yet handed out
    done: bool = False
    busy: bool = False  # in a batch being decoded (set and cleared by the batcher)
    features: np.ndarray[Any, np.dtype[np.float32]] | None = None  # while being decoded
    fallback: int = 0  # index in `options.temperatures` of the next step's temperature
    attempts: list[Attempt] = field(default_factory=list)  # earlier temperatures, this seek
    encoded: np.ndarray[Any, np.dtype[np.float32]] | None = None  # (CPU) between rounds

    @property
    def previous_tokens(self) -> list[int]:
        """The prompt conditions a window's first step only (as in faster-whisper without
        `condition_on_previous_text`), at most half the model's context."""
        return self.prompt[-(MAX_LENGTH // 2 - 1) :] if self.seek == 0 else []

    @property
    def temperature(self) -> float:
        """The temperature of the window's next step."""
        return self.options.temperatures[self.fallback]

    @property
    def key(self) -> tuple[float, int]:
        """Windows with one key can share a decoder call: one temperature, and the start
        token at one position (CTranslate2's rule), i.e. prompts of one length."""
        return (self.temperature, len(self.previous_tokens))


class Transcriber:
    """The model: loads once and decodes batches of windows."""

    def __init__(
        self,
        model_path: str,
        threads: int = 0,
        beam_size: int = 5,
        *,
        vad_filter: bool = False,
        max_batch_size: int = 8,
        gpus: int = 0,
        compute_type: str | None = None,
        workers: int = 1,
    ) -> None:
        from faster_whisper import WhisperModel

        self._tokenizers: dict[tuple[str, str], Any] = {}
        self._suppress: list[int] | None = None
        self.decoding = Decoding(
            beam_size=beam_size, vad_filter=vad_filter, max_batch_size=max_batch_size
        )
        self.device = "cuda" if gpus else "cpu"
        # Parallel batches: one per GPU, or `workers` on the CPU sharing its threads.
        self.workers = gpus or max(1, workers)
        threads = threads or cpu_count()
        if gpus:
            check_gpus(gpus)
        try:
            self.model = WhisperModel(
                model_path,
                device=self.device,
                device_index=list(range(gpus)) if gpus else 0,
                compute_type=compute_type or ("float16" if gpus else "int8"),
                cpu_threads=max(1, threads // self.workers),
                num_workers=1 if gpus else self.workers,  # (per device)
            )
            self.internals = compat.Internals(self.model)
            if gpus:
                self.warm_up()
        except Exception as e:
            if gpus:
                raise DeviceError(unusable(gpus, e)) from e
            raise

    @property
    def multilingual(self) -> bool:
        return self.internals.multilingual

    # ------------------------------------------------------------------ windows

    def windows(self, audio: Audio, options: Options) -> list[Window]:
        """Cut a request's audio into windows: on the silences VAD finds between speech when
        the pool filters with VAD, else at the quietest moment before each 30 s mark."""
        if self.decoding.vad_filter:
            parts = speech_windows(audio)
        else:
            parts = [[r] for r in split_on_silence(audio)]
        language = options.language or (None if self.multilingual else "en")
        prompt = _prompt_tokens(self._tokenizer(options.task, language or "en"), options.prompt)
        return [
            Window(audio, ranges, options, index=i, prompt=prompt, language=language)
            for i, ranges in enumerate(parts)
        ]

    def warm_up(self) -> None:
        """One step on a second of silence: loads every library decoding needs (cuBLAS on a
        GPU) now, at start-up, rather than on the first request."""
        silence = np.zeros(SAMPLE_RATE, dtype=np.float32)
        language = None if self.multilingual else "en"
        self.step([Window(silence, [(0, SAMPLE_RATE)], Options(), language=language)])

    # ------------------------------------------------------------------ one batch step

    def step(self, batch: list[Window]) -> None:
        """Decode the next 30 s of every window in `batch` (all with the same `key`) at the
        windows' temperature: one round of the temperature fallback.

        A window whose text is acceptable, or whose last temperature is spent, appends its
        finished segments to `window.segments`, then is marked done or moves its `seek` on
        for another step. A window whose text looks wrong keeps the attempt and moves on to
        the next temperature, for another step at the same `seek`.
        """
        fw = self.internals
        for w in batch:
            if w.features is None:
                w.features = fw.features(_samples(w))
        sizes = [min(WINDOW_FRAMES, _frames(w) - w.seek) for w in batch]
        features = np.stack(
            [
                compat.pad_or_trim(w.features[:, w.seek : w.seek + n])  # type: ignore[index]
                for w, n in zip(batch, sizes, strict=True)
            ]
        )
        encoded, rows = self._encode(features, [w.encoded for w in batch])
        undetected = [i for i, w in enumerate(batch) if w.language is None]
        if undetected:
            detected = fw.ctranslate2.detect_language(encoded)
            for i in undetected:
                batch[i].language = likeliest(detected[i], batch[i].options.languages)
        tokenizers = [self._tokenizer(w.options.task, w.language or "en") for w in batch]
        prompts = [
            fw.prompt(tok, w.previous_tokens) for w, tok in zip(batch, tokenizers, strict=True)
        ]
        chosen = self._generate(encoded, prompts, tokenizers, batch)
        for i, (w, attempt) in enumerate(zip(batch, chosen, strict=True)):
            if attempt is None:  # another round, at the next temperature
                w.fallback += 1
                w.encoded = None if rows is None else rows[i].copy()
            else:
                w.fallback, w.attempts, w.encoded = 0, [], None
        finished = [i for i, a in enumerate(chosen) if a is not None]
        if not finished:
            return
        if len(finished) < len(batch):
            batch = [batch[i] for i in finished]
            tokenizers = [tokenizers[i] for i in finished]
            sizes = [sizes[i] for i in finished]
            if any(w.options.words or w.options.logprobs for w in batch):
                encoded = _rows(encoded, finished)
        results = [a for a in chosen if a is not None]

        splits: list[Split] = []
        for w, tok, n, (result, avg_logprob, _, _) in zip(
            batch, tokenizers, sizes, results, strict=True
        ):
            if result.no_speech_prob > NO_SPEECH_THRESHOLD and avg_logprob <= LOG_PROB_THRESHOLD:
                splits.append(None)  # silence: nothing to say in these 30 s
                continue
            offset = w.seek * fw.time_per_frame
            splits.append(fw.split_segments(tok, result.sequences_ids[0], offset, n, w.seek))
        if any(w.options.words for w in batch):
            self._add_words(batch, tokenizers, sizes, encoded, splits)
        if any(w.options.logprobs for w in batch):
            self._add_logprobs(batch, tokenizers, sizes, encoded, splits)

        for w, tok, n, split, (result, avg_logprob, temperature, ratio) in zip(
            batch, tokenizers, sizes, splits, results, strict=True
        ):
            if split is None:
                w.seek += n
            else:
                parts, seek, _ = split
                tmap = TimeMap(w.ranges)
                for part in parts:
                    text = tok.decode(part["tokens"])
                    if part["start"] == part["end"] or not text.strip():
                        continue
                    segment = _segment(part, text, tmap, temperature, avg_logprob, ratio, result)
                    if w.options.logprobs:
                        segment.logprobs = [
                            (tok.decode([t]), lp) for t, lp in part.get("logprobs", [])
                        ]
                    w.segments.append(segment)
                w.seek = seek
            if w.seek >= _frames(w):
                w.done = True
                w.features = None

    def _encode(
        self,
        features: np.ndarray[Any, np.dtype[np.float32]],
        kept: list[np.ndarray[Any, np.dtype[np.float32]] | None],
    ) -> tuple[Any, Any]:
        """The encoder output of a batch (and, on the CPU, the same as an array).

        On a GPU the whole batch goes through the encoder at once (a window's later fallback
        rounds included: encoding again is cheaper than a round trip to the host). On the CPU
        each window goes alone and the outputs are stacked: a batch of 30 s windows gains
        nothing there (the encoder is compute-bound) and costs cache, while the decoder does
        gain from batching; a window in a later fallback round reuses its `kept` output.
        """
        import ctranslate2

        if self.device != "cpu":
            return self.internals.encode(features), None
        rows = np.concatenate(
            [
                np.asarray(self.internals.encode(f[None])) if k is None else k[None]
                for f, k in zip(features, kept, strict=True)
            ]
        )
        return ctranslate2.StorageView.from_array(np.ascontiguousarray(rows)), rows

    def _generate(
        self, encoded: Any, prompts: list[list[int]], tokenizers: list[Any], batch: list[Window]
    ) -> list[Attempt | None]:
        """One round of faster-whisper's `generate_with_fallback`, for a batch at one
        temperature: each window's attempt is kept in `window.attempts`; a window whose
        text looks wrong (too repetitive, or too improbable) gets None, to be decoded again
        at the next temperature, unless that was its last: then it keeps its most probable
        readable attempt (`choose`)."""
        fw = self.internals
        temperature = batch[0].temperature
        if temperature > 0:
            sampling = {
                "beam_size": 1,
                "num_hypotheses": BEST_OF,
                "sampling_topk": 0,
                "sampling_temperature": temperature,
            }
        else:
            sampling = {"beam_size": self.decoding.beam_size, "patience": 1}
        outputs = fw.ctranslate2.generate(
            encoded,
            prompts,
            length_penalty=1,
            repetition_penalty=1,
            no_repeat_ngram_size=0,
            max_length=fw.max_length,
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=self._suppressed(),
            max_initial_timestamp_index=round(MAX_INITIAL_TIMESTAMP / fw.time_precision),
            **sampling,
        )
        chosen: list[Attempt | None] = []
        for w, tok, out in zip(batch, tokenizers, outputs, strict=True):
            tokens = out.sequences_ids[0]
            avg_logprob = out.scores[0] * len(tokens) / (len(tokens) + 1)
            ratio = compat.compression_ratio(tok.decode(tokens).strip())
            w.attempts.append((out, avg_logprob, temperature, ratio))
            chosen.append(choose(w.attempts, w.options.temperatures))
        return chosen

    def _add_words(
        self,
        batch: list[Window],
        tokenizers: list[Any],
        sizes: list[int],
        encoded: Any,
        splits: list[Split],
    ) -> None:
        """Word timestamps: one alignment call for the whole batch, then faster-whisper's
        per-window heuristics (`add_word_timestamps`) on each window's share of it."""
        fw = self.internals
        text_tokens = [
            [t for part in (s[0] if s else []) for t in part["tokens"] if t < tok.eot]
            for s, tok in zip(splits, tokenizers, strict=True)
        ]
        # Alignment starts from one start sequence; windows of another language or task get
        # their own call (rare: most batches share one).
        alignments: dict[int, Any] = {}
        for i, (w, tok, split) in enumerate(zip(batch, tokenizers, splits, strict=True)):
            if not w.options.words or split is None or i in alignments:
                continue
            group = [
                j
                for j, other in enumerate(tokenizers)
                if other.sot_sequence == tok.sot_sequence and batch[j].options.words
            ]
            aligned = fw.find_alignment(tok, text_tokens, encoded, sizes)
            for j in group:
                alignments[j] = aligned[j]
        for i, (w, tok, split) in enumerate(zip(batch, tokenizers, splits, strict=True)):
            if i not in alignments or split is None or not split[0]:
                continue
            parts, seek, single_timestamp_ending = split
            fw.add_word_timestamps(
                alignments[i], parts, tok, encoded, sizes[i],
                PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS, w.last_speech,
            )  # fmt: skip
            last_word_end = compat.last_word_end(parts)
            time_offset = w.seek * fw.time_per_frame
            if not single_timestamp_ending and last_word_end and last_word_end > time_offset:
                seek = round(last_word_end * fw.frames_per_second)
                splits[i] = (parts, seek, single_timestamp_ending)
            if last_word_end is not None:
                w.last_speech = last_word_end

    def _add_logprobs(
        self,
        batch: list[Window],
        tokenizers: list[Any],
        sizes: list[int],
        encoded: Any,
        splits: list[Split],
    ) -> None:
        """Each text token's log probability, for the windows that ask: CTranslate2's
        alignment of the decoded text (the model's probability of each token given the
        audio and the window's tokens before it), one call per start sequence, the same
        call faster-whisper's word probabilities come from. Sets `part["logprobs"]`."""
        texts = [
            [[t for t in part["tokens"] if t < tok.eot] for part in (s[0] if s else [])]
            for s, tok in zip(splits, tokenizers, strict=True)
        ]
        done: set[int] = set()
        for i, (w, tok) in enumerate(zip(batch, tokenizers, strict=True)):
            if not w.options.logprobs or i in done or not any(texts[i]):
                continue
            group = [
                j for j, other in enumerate(tokenizers)
                if other.sot_sequence == tok.sot_sequence and batch[j].options.logprobs
                and any(texts[j])
            ]  # fmt: skip
            results = self.internals.ctranslate2.align(
                _rows(encoded, group),
                tok.sot_sequence,
                [[t for part in texts[j] for t in part] for j in group],
                [sizes[j] for j in group],
            )
            for j, result in zip(group, results, strict=True):
                done.add(j)
                probs = iter(result.text_token_probs)
                parts = splits[j][0]  # type: ignore[index]
                for part, tokens in zip(parts, texts[j], strict=True):
                    part["logprobs"] = [(t, math.log(max(next(probs), 1e-30))) for t in tokens]

    def _tokenizer(self, task: str, language: str) -> Any:
        key = (task, language)
        if key not in self._tokenizers:
            self._tokenizers[key] = self.internals.tokenizer(task, language)
        return self._tokenizers[key]

    def _suppressed(self) -> list[int]:
        if self._suppress is None:
            self._suppress = compat.suppressed_tokens(self._tokenizer("transcribe", "en"))
        return self._suppress


def _prompt_tokens(tokenizer: Any, prompt: str | None) -> list[int]:
    return list(tokenizer.encode(" " + prompt.strip())) if prompt else []


def _samples(w: Window) -> Audio:
    if len(w.ranges) == 1:
        a, b = w.ranges[0]
        return w.audio[a:b]
    return np.concatenate([w.audio[a:b] for a, b in w.ranges]) if w.ranges else w.audio[:0]


def _frames(w: Window) -> int:
    """Mel frames of the window's audio (faster-whisper's `content_frames`)."""
    assert w.features is not None
    return int(w.features.shape[-1]) - 1


def choose(attempts: list[Attempt], temperatures: tuple[float, ...]) -> Attempt | None:
    """The attempt a window keeps after these rounds (one per temperature, in order): the
    last, if its text is acceptable; after the last temperature, the most probable readable
    attempt (reported at the last temperature, as faster-whisper does); else None, for
    another round."""
    last = attempts[-1]
    if _acceptable(last[0], last[1], last[3]):
        return last
    if len(attempts) < len(temperatures):
        return None
    readable = [a for a in attempts if a[3] <= COMPRESSION_RATIO_THRESHOLD]
    best = max(readable or attempts, key=lambda a: a[1])
    return (best[0], best[1], temperatures[-1], best[3])


def _acceptable(out: Any, avg_logprob: float, ratio: float) -> bool:
    if out.no_speech_prob > NO_SPEECH_THRESHOLD and avg_logprob < LOG_PROB_THRESHOLD:
        return True  # silence: nothing better to find at a higher temperature
    return ratio <= COMPRESSION_RATIO_THRESHOLD and avg_logprob >= LOG_PROB_THRESHOLD


def _segment(
    part: dict[str, Any],
    text: str,
    tmap: TimeMap,
    temperature: float,
    avg_logprob: float,
    ratio: float,
    result: Any,
) -> Segment:
    """A decoded segment, its times (and its words') mapped back onto the request's audio."""
    words = [
        (w["word"], *tmap.word(float(w["start"]), float(w["end"]))) for w in part.get("words") or []
    ]
    if words:
        start, end = words[0][1], words[-1][2]
    else:
        start, end = tmap.original(float(part["start"])), tmap.original(float(part["end"]), True)
    return Segment(
        id=0,  # numbered by the batcher, in the order segments are handed out
        start=start,
        end=end,
        text=text,
        tokens=list(part["tokens"]),
        temperature=temperature,
        avg_logprob=float(avg_logprob),
        compression_ratio=ratio,
        no_speech_prob=float(result.no_speech_prob),
        words=words,
    )


def likeliest(detected: list[tuple[str, float]], allowed: tuple[str, ...]) -> str:
    """The likeliest language of CTranslate2's detection (every language token with its
    probability, likeliest first) among `allowed` (any, if empty): "<|de|>" -> "de"."""
    codes = [token[2:-2] for token, _ in detected]
    return next((c for c in codes if not allowed or c in allowed), allowed[0] if allowed else "en")


def _rows(encoded: Any, rows: list[int]) -> Any:
    """The encoder output of these windows of a batch (all of it when they are all)."""
    import ctranslate2

    if len(rows) == encoded.shape[0]:
        return encoded
    array = np.asarray(encoded) if encoded.device == "cpu" else None
    if array is None:  # on a GPU: through the CPU (rare: logprobs with mixed batches)
        array = np.asarray(encoded.to_device(ctranslate2.Device.cpu))
    return ctranslate2.StorageView.from_array(np.ascontiguousarray(array[rows]))
