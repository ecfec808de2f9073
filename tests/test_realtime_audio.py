"""Realtime transcription audio: G.711 decoding, resampling to 16 kHz, WAV wrapping, Silero
VAD as a stream, and server_vad turn detection on real speech (espeak-ng, sox)."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
import wave
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from testkit.audio import SENTENCES, require_tools, speak
from transcription_frontend.audio import vad
from transcription_frontend.audio.encode import wav
from transcription_frontend.audio.pcm import FORMATS, To16k, denoise, to_pcm16
from transcription_frontend.audio.vad import (
    FRAME,
    Event,
    ServerVad,
    Silero,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
)

Int16 = npt.NDArray[np.int16]
Floats = npt.NDArray[np.float32]


# --- helpers -------------------------------------------------------------------------------


def read_wav(path: Path) -> tuple[Int16, int]:
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2"), w.getframerate()


def speech_at(text: str, directory: Path, rate: int) -> Int16:
    """`text` spoken by espeak-ng, as 16-bit samples at `rate` (sox)."""
    source = speak(text, directory)
    if rate == 16000:
        return read_wav(source)[0]
    out = source.with_suffix(f".{rate}.wav")
    if not out.exists():
        subprocess.run(
            ["sox", "-R", str(source), "-r", str(rate), "-c", "1", "-b", "16", str(out)], check=True
        )
    samples, got = read_wav(out)
    assert got == rate
    return samples


def voiced_ms(samples: Int16, rate: int) -> tuple[int, int]:
    """Where a clip's speech starts and ends (ms), by energy: 10 ms windows louder than 1%
    of the loudest (-40 dB); espeak-ng pads its speech with some silence of its own."""
    win = rate // 100
    n = samples.size // win
    rms = np.sqrt((samples[: n * win].astype(np.float64).reshape(n, win) ** 2).mean(axis=1))
    loud = np.flatnonzero(rms > 0.01 * rms.max())
    return int(loud[0]) * 10, (int(loud[-1]) + 1) * 10


def pieces(data: bytes, rate: int, seed: int, lo_ms: int = 20, hi_ms: int = 100) -> Iterator[bytes]:
    """16-bit PCM cut in random pieces of lo_ms..hi_ms, as a client would send it."""
    rng = np.random.default_rng(seed)
    i = 0
    while i < len(data):
        n = 2 * int(rng.integers(rate * lo_ms // 1000, rate * hi_ms // 1000 + 1))
        yield data[i : i + n]
        i += n


def silence(seconds: float, rate: int) -> Int16:
    return np.zeros(round(seconds * rate), dtype=np.int16)


def turns(detector: TurnDetector, pcm: bytes, rate: int, seed: int = 0) -> list[Event]:
    resampler = To16k(rate)
    events: list[Event] = []
    for piece in pieces(pcm, rate, seed):
        events += detector.feed(resampler.feed(piece))
    events += detector.feed(resampler.flush())
    return events


@pytest.fixture(scope="module")
def speech_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_tools()
    return tmp_path_factory.mktemp("speech")


@pytest.fixture(scope="module")
def silero() -> Silero:
    return Silero()


# --- G.711, PCM, WAV -------------------------------------------------------------------------


def ulaw_encode(x: int) -> int:
    """ITU-T G.711 mu-law encoding of one 16-bit sample (the reference g711.c)."""
    bias, clip = 0x84, 32635
    sign = 0x80 if x < 0 else 0
    x = min(abs(x), clip) + bias
    exponent = max(0, x.bit_length() - 8)  # segment: 0..7
    mantissa = (x >> (exponent + 3)) & 0x0F
    return ~(sign | (exponent << 4) | mantissa) & 0xFF


def alaw_encode(x: int) -> int:
    """ITU-T G.711 A-law encoding of one 16-bit sample (the reference g711.c)."""
    sign = 0x80 if x >= 0 else 0
    x = min(abs(x) if x >= 0 else -x - 1, 32767) >> 3  # 13-bit magnitude
    if x < 32:
        code = x >> 1
    else:
        exponent = x.bit_length() - 5  # 1..7
        code = (exponent << 4) | ((x >> exponent) & 0x0F)
    return (sign | code) ^ 0x55


@pytest.mark.parametrize(
    ("fmt", "encode"), [("audio/pcmu", ulaw_encode), ("audio/pcma", alaw_encode)]
)
def test_g711_round_trip_of_a_sine(fmt: str, encode: Callable[[int], int]) -> None:
    t = np.arange(FORMATS[fmt]) / FORMATS[fmt]
    for amplitude in (20000, 2000, 300):
        sine = np.round(amplitude * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
        coded = bytes(encode(int(s)) for s in sine)
        decoded = np.frombuffer(to_pcm16(fmt, coded), dtype="<i2").astype(np.float64)
        assert decoded.size == sine.size
        noise = decoded - sine
        snr = 10 * np.log10((sine.astype(np.float64) ** 2).sum() / (noise**2).sum())
        assert snr > 30, (fmt, amplitude, snr)


@pytest.mark.parametrize(("fmt", "sox_type"), [("audio/pcmu", "ul"), ("audio/pcma", "al")])
def test_g711_decoding_of_every_code_matches_sox(fmt: str, sox_type: str) -> None:
    require_tools()
    codes = bytes(range(256))
    reference = subprocess.run(
        ["sox", "-t", sox_type, "-r", "8000", "-c", "1", "-", "-t", "s16", "-e", "signed", "-L", "-"],
        input=codes, capture_output=True, check=True,
    ).stdout  # fmt: skip
    assert to_pcm16(fmt, codes) == reference


def test_pcm_passes_through_and_refuses_odd_byte_counts() -> None:
    data = np.arange(-100, 100, dtype="<i2").tobytes()
    assert to_pcm16("audio/pcm", data) == data
    assert to_pcm16("audio/pcm", b"") == b""
    with pytest.raises(ValueError, match=r"odd byte count \(3\)"):
        to_pcm16("audio/pcm", b"abc")
    with pytest.raises(ValueError, match="even byte count"):
        To16k(24000).feed(b"abc")


def test_unknown_format_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"unknown audio format 'audio/opus'.*audio/pcmu"):
        to_pcm16("audio/opus", b"\x00\x00")
    with pytest.raises(ValueError, match="unknown audio format 'pcm16'"):
        to_pcm16("pcm16", b"\x00\x00")


@pytest.mark.parametrize("rate", [24000, 8000, 16000, 44100])
def test_resampling_to_16k_keeps_count_and_pitch(rate: int) -> None:
    seconds = 3
    t = np.arange(seconds * rate) / rate
    sine = np.round(16384 * np.sin(2 * np.pi * 440 * t)).astype("<i2")
    resampler = To16k(rate)
    out = [resampler.feed(p) for p in pieces(sine.tobytes(), rate, seed=rate)]
    out.append(resampler.flush())
    assert all(o.dtype == np.float32 for o in out)
    samples = np.concatenate(out)
    assert abs(samples.size - seconds * 16000) <= 4, samples.size
    assert np.abs(samples).max() <= 1.0
    middle = samples[8000:-8000]  # away from the filter's edges
    spectrum = np.abs(np.fft.rfft(middle * np.hanning(middle.size)))
    peak_hz = np.argmax(spectrum) * 16000 / middle.size
    assert abs(peak_hz - 440) < 2, peak_hz
    assert np.sqrt((middle**2).mean()) == pytest.approx(0.5 / np.sqrt(2), rel=0.02)
    if rate == 16000:  # no resampling: exactly the samples, scaled
        np.testing.assert_array_equal(samples, sine.astype(np.float32) / 32768)


def test_wav_is_readable() -> None:
    pcm = np.arange(-500, 500, 3, dtype="<i2").tobytes()
    with wave.open(io.BytesIO(wav(pcm, 24000))) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        assert w.getnframes() == len(pcm) // 2
        assert w.readframes(w.getnframes()) == pcm


# --- Silero as a stream ---------------------------------------------------------------------


def test_streaming_probabilities_equal_faster_whispers_whole_clip(
    speech_dir: Path, silero: Silero
) -> None:
    from faster_whisper.vad import SileroVADModel

    clip16 = np.concatenate(
        [silence(0.3, 16000), speech_at(SENTENCES[0], speech_dir, 16000), silence(0.7, 16000)]
    )
    audio = clip16.astype(np.float32) / 32768
    # faster-whisper zeroes the last 64 samples of the last frame in place (its context
    # array is a view of the input), so that frame is only comparable where they are zeros
    # already: pad to a multiple of 512 with at least 64 zeros.
    pad = -audio.size % FRAME
    audio = np.pad(audio, (0, pad + (FRAME if pad < 64 else 0)))
    offline = SileroVADModel(str(vad.model_path()))(audio.copy()).reshape(-1)

    silero.reset()
    rng = np.random.default_rng(7)
    streamed: list[Floats] = []
    i = 0
    while i < audio.size:
        n = int(rng.integers(320, 1601))  # 20..100 ms
        streamed.append(silero.probabilities(audio[i : i + n]))
        i += n
    online = np.concatenate(streamed)
    assert online.shape == offline.shape == (audio.size // FRAME,)
    assert offline.max() > 0.9 and offline.min() < 0.1  # speech and silence both seen
    np.testing.assert_allclose(online, offline, atol=1e-4, rtol=0)

    silero.reset()  # a reset stream starts over: the same probabilities again
    np.testing.assert_allclose(silero.probabilities(audio), offline, atol=1e-4, rtol=0)


def test_incomplete_frames_wait_for_the_next_call(silero: Silero) -> None:
    silero.reset()
    assert silero.probabilities(np.zeros(511, np.float32)).shape == (0,)
    assert silero.probabilities(np.zeros(1, np.float32)).shape == (1,)
    assert silero.probabilities(np.zeros(1024 + 100, np.float32)).shape == (2,)
    assert silero.probabilities(np.zeros(412, np.float32)).shape == (1,)


def test_model_is_found_without_importing_faster_whisper() -> None:
    code = (
        "import sys\n"
        "from transcription_frontend.audio.vad import Silero\n"
        "Silero().probabilities([0.0] * 1024)\n"
        "assert 'faster_whisper' not in sys.modules and 'ctranslate2' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_faster_whisper_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="faster-whisper package"):
        Silero()


# --- turn detection on real speech ---------------------------------------------------------


def test_two_sentences_make_two_turns(speech_dir: Path, silero: Silero) -> None:
    rate = 24000
    first, second = (speech_at(s, speech_dir, rate) for s in SENTENCES[1:3])
    clip = np.concatenate(
        [silence(0.5, rate), first, silence(1.2, rate), second, silence(1.5, rate)]
    )
    offsets = [500, 500 + first.size * 1000 / rate + 1200]
    truth = [
        (at + a, at + b)
        for at, (a, b) in zip(
            offsets, (voiced_ms(first, rate), voiced_ms(second, rate)), strict=True
        )
    ]

    settings = ServerVad()
    silero.reset()
    events = turns(TurnDetector(settings, silero), clip.tobytes(), rate, seed=3)

    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped] * 2, events
    for (start, stop), (speech_from, speech_to) in zip(
        zip(events[::2], events[1::2], strict=True), truth, strict=True
    ):
        assert isinstance(start, SpeechStarted) and isinstance(stop, SpeechStopped)
        expect_start = max(0, speech_from - settings.prefix_padding_ms)
        expect_end = speech_to + settings.silence_duration_ms
        assert abs(start.audio_start_ms - expect_start) <= 250, (events, truth)
        assert abs(stop.audio_end_ms - expect_end) <= 250, (events, truth)
    assert isinstance(events[1], SpeechStopped) and isinstance(events[2], SpeechStarted)
    assert events[1].audio_end_ms <= events[2].audio_start_ms


def test_prefix_padding_is_clamped_at_zero(speech_dir: Path, silero: Silero) -> None:
    rate = 24000
    clip = np.concatenate(
        [silence(0.1, rate), speech_at(SENTENCES[3], speech_dir, rate), silence(1.0, rate)]
    )
    silero.reset()
    events = turns(TurnDetector(ServerVad(), silero), clip.tobytes(), rate, seed=5)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped], events
    assert events[0] == SpeechStarted(audio_start_ms=0)


@pytest.mark.parametrize("kind", ["digital silence", "low noise", "hum"])
def test_silence_and_low_noise_never_start_speech(kind: str, silero: Silero) -> None:
    rate = 24000
    rng = np.random.default_rng(11)
    n = 8 * rate
    signal = {
        "digital silence": np.zeros(n),
        "low noise": rng.normal(0, 30, n),  # about -60 dBFS
        "hum": 300 * np.sin(2 * np.pi * 50 * np.arange(n) / rate) + rng.normal(0, 10, n),
    }[kind]
    silero.reset()
    assert turns(TurnDetector(ServerVad(), silero), signal.astype("<i2").tobytes(), rate) == []


# --- turn detection rules, on scripted probabilities ----------------------------------------


class Scripted:
    """A stand-in VAD model: each 512-sample frame's first sample is its probability."""

    def __init__(self) -> None:
        self.pending = np.zeros(0, np.float32)

    def probabilities(self, samples16k: npt.ArrayLike) -> Floats:
        audio = np.concatenate([self.pending, np.asarray(samples16k, np.float32).reshape(-1)])
        count = audio.size // FRAME
        self.pending = audio[count * FRAME :]
        return audio[: count * FRAME].reshape(count, FRAME)[:, 0].copy()

    def reset(self) -> None:
        self.pending = np.zeros(0, np.float32)


def script(*runs: tuple[float, int]) -> Floats:
    """Frames of given probabilities: (probability, frame count) runs."""
    return np.repeat(np.concatenate([np.full(n, p, np.float32) for p, n in runs]), FRAME)


def scripted(settings: ServerVad | None = None) -> TurnDetector:
    return TurnDetector(settings or ServerVad(), Scripted())


def test_turn_times_follow_the_frames() -> None:
    detector = scripted()
    # 20 frames of silence (640 ms), 10 of speech, then silence from 960 ms.
    events = detector.feed(script((0.0, 20), (0.9, 10), (0.0, 20)))
    assert events == [SpeechStarted(audio_start_ms=340), SpeechStopped(audio_end_ms=1460)]
    assert detector.position_ms == 50 * 32 and not detector.speaking


def test_blips_shorter_than_min_speech_are_no_turn() -> None:
    detector = scripted()
    assert (
        detector.feed(
            script((0.0, 5), (0.9, 2), (0.0, 40), (0.6, 1), (0.1, 1), (0.9, 2), (0.0, 30))
        )
        == []
    )
    # three frames (96 ms) are enough; the start is the first of them
    assert detector.feed(script((0.9, 3))) == [SpeechStarted(audio_start_ms=(81 * 32) - 300)]
    assert detector.speaking


def test_hysteresis_between_the_thresholds() -> None:
    detector = scripted()
    assert detector.feed(script((0.9, 5))) == [SpeechStarted(audio_start_ms=0)]
    # 0.4 (between threshold - 0.15 and threshold) neither starts nor ends a silence
    assert detector.feed(script((0.4, 40))) == []
    # silence starts below 0.35 and goes on through 0.4 ...
    assert detector.feed(script((0.2, 5), (0.4, 11))) == [SpeechStopped(audio_end_ms=45 * 32 + 500)]
    # ... but a frame at the threshold ends it
    detector = scripted()
    detector.feed(script((0.9, 5)))
    assert detector.feed(script((0.2, 10), (0.5, 1), (0.2, 10))) == []
    assert detector.feed(script((0.2, 10))) == [SpeechStopped(audio_end_ms=16 * 32 + 500)]


def test_start_is_clamped_at_the_previous_turns_end() -> None:
    settings = ServerVad(silence_duration_ms=200, prefix_padding_ms=300)
    events = scripted(settings).feed(script((0.0, 20), (0.9, 10), (0.0, 8), (0.9, 10), (0.0, 10)))
    end = 30 * 32 + 200
    assert events == [
        SpeechStarted(audio_start_ms=340),
        SpeechStopped(audio_end_ms=end),
        SpeechStarted(audio_start_ms=end),  # 38 * 32 - 300 would be before it
        SpeechStopped(audio_end_ms=48 * 32 + 200),
    ]


def test_reset_keeps_the_timeline_and_forgets_the_turn() -> None:
    detector = scripted()
    assert detector.feed(script((0.9, 10))[:-100]) == [SpeechStarted(audio_start_ms=0)]
    detector.reset(at_ms=5000)  # cleared mid-speech; the incomplete frame goes too
    assert not detector.speaking and detector.position_ms == 5000
    assert detector.feed(script((0.9, 2))) == []  # needs MIN_SPEECH_MS anew after the clear
    events = detector.feed(script((0.9, 2), (0.0, 20)))
    assert events == [
        SpeechStarted(audio_start_ms=5000),
        SpeechStopped(audio_end_ms=5000 + 4 * 32 + 500),
    ]


def test_events_in_one_feed_keep_their_order_across_uneven_pieces() -> None:
    audio = script((0.0, 3), (0.9, 4), (0.0, 17), (0.8, 6), (0.0, 17))
    whole = scripted().feed(audio)
    detector = scripted()
    rng = np.random.default_rng(1)
    split: list[Event] = []
    i = 0
    while i < audio.size:
        n = int(rng.integers(1, 2000))
        split += detector.feed(audio[i : i + n])
        i += n
    assert split == whole
    assert [type(e) for e in whole] == [SpeechStarted, SpeechStopped] * 2


def test_streams_keep_their_own_state(speech_dir: Path) -> None:
    audio = speech_at(SENTENCES[0], speech_dir, 16000).astype(np.float32) / 32768
    audio = audio[: audio.size // FRAME * FRAME]
    alone = Silero().probabilities(audio)
    a, b = Silero(), Silero()
    rng = np.random.default_rng(2)
    got: list[Floats] = []
    for i in range(0, audio.size, 1000):
        got.append(a.probabilities(audio[i : i + 1000]))
        b.probabilities(rng.normal(0, 0.3, 700).astype(np.float32))  # another session's audio
    np.testing.assert_allclose(np.concatenate(got), alone, atol=1e-6, rtol=0)


# --- noise reduction (session.audio.input.noise_reduction) ---------------------------------


@pytest.mark.parametrize("kind", ["near_field", "far_field"])
def test_denoise_raises_the_snr_of_noisy_speech_and_keeps_every_sample(
    kind: str, speech_dir: Path
) -> None:
    clean = speech_at(SENTENCES[0], speech_dir, 24000).astype(np.float64)
    rng = np.random.default_rng(7)
    noise = rng.normal(0, np.sqrt((clean**2).mean() / 100), len(clean))  # 20 dB SNR
    noisy = np.clip(clean + noise, -32768, 32767).astype("<i2")
    out = np.frombuffer(denoise(noisy.tobytes(), 24000, kind), dtype="<i2").astype(np.float64)
    assert len(out) >= len(clean)  # padded: afftdn's delay loses nothing at the end

    def snr(signal: npt.NDArray[np.float64]) -> float:
        # afftdn delays its output: compare at the best alignment within 50 ms
        ref = clean[: len(clean) - 1200]
        n = len(ref)
        k = max(range(0, 1200, 4), key=lambda k: float(np.dot(ref, signal[k : k + n])))
        return float(10 * np.log10((ref**2).sum() / ((ref - signal[k : k + n]) ** 2).sum()))

    before, after = snr(noisy.astype(np.float64)), snr(out)
    print(f"{kind}: {before:.1f} dB -> {after:.1f} dB")
    assert after > before + 1, (before, after)


def test_denoise_refuses_an_unknown_kind() -> None:
    with pytest.raises(KeyError):
        denoise(bytes(4800), 24000, "studio")
