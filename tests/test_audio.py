"""The gateway's audio package, piece by piece: the MP3 frame header (the one place that
says whether an MP3's length is counted or estimated), the WAV writer, the resampler across
a change of input format, and the VAD's gain and hysteresis. Whole files through sniffing,
decoding and cutting: test_sniff.py, test_longaudio_cut.py, test_realtime_audio.py."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np
import numpy.typing as npt
import pytest

from transcription_frontend.audio import headers, vad
from transcription_frontend.audio.encode import wav
from transcription_frontend.audio.pcm import RATE, Resampler, frame_of

# --- MP3 -------------------------------------------------------------------------------------

# MPEG-1 Layer III, 128 kbit/s, 44.1 kHz, stereo: its side information is 32 bytes, so a
# Xing/Info header starts where a VBRI header does, 32 bytes after the frame header.
FRAME_HEADER = b"\xff\xfb\x90\x00"
SIDE = 32
FRAME_BYTES = 417  # 144 * 128000 / 44100


def frame(tag: bytes = b"") -> bytes:
    """A first frame with `tag` (a Xing/Info or VBRI header) where libav looks for it."""
    return (FRAME_HEADER + bytes(SIDE) + tag).ljust(FRAME_BYTES, b"\x00")


def xing(name: bytes = b"Xing", flags: int = 0x1, frames: int = 1000) -> bytes:
    return name + struct.pack(">II", flags, frames)


def vbri(frames: int = 1000) -> bytes:
    return b"VBRI" + struct.pack(">HHHII", 1, 0, 0, 0, frames)


def id3(size: int, footer: bool = False) -> bytes:
    synchsafe = bytes((size >> s) & 0x7F for s in (21, 14, 7, 0))
    return b"ID3\x04\x00" + bytes([0x10 if footer else 0]) + synchsafe + bytes(size)


def mp3(first: bytes, frames: int = 50) -> bytes:
    return first + frame() * (frames - 1)


def read(data: bytes) -> headers.Mp3Frame | None:
    return headers.mp3_frame(io.BytesIO(data), data[: headers.HEAD])


@pytest.mark.parametrize("tag", [xing(), xing(b"Info"), vbri()])
def test_a_frame_count_makes_the_length_exact(tag: bytes) -> None:
    data = mp3(frame(tag))
    found = read(data)
    assert found == headers.Mp3Frame(start=0, rate=44100, samples=1152, kbps=128, frames=1000)
    assert found.seconds(len(data)) == pytest.approx(1000 * 1152 / 44100)
    assert headers.length_is_exact("mp3", io.BytesIO(data))


def test_without_a_frame_count_the_length_is_the_bit_rate_over_the_size() -> None:
    for first in (frame(), frame(xing(flags=0x2))):  # a Xing header without its frame count
        data = mp3(first)
        found = read(data)
        assert found is not None and found.frames is None
        assert found.seconds(len(data)) == pytest.approx(len(data) * 8 / 128000)
        assert not headers.length_is_exact("mp3", io.BytesIO(data))


@pytest.mark.parametrize("footer", [False, True])
def test_the_first_frame_follows_the_id3_tag(footer: bool) -> None:
    tag = id3(1000, footer) + (bytes(10) if footer else b"")
    data = tag + mp3(frame(xing()))
    found = read(data)
    assert found is not None and (found.start, found.frames) == (len(tag), 1000)


def test_an_id3_tag_past_the_first_read_is_skipped_in_the_file() -> None:
    """Cover art makes tags larger than the bytes read first: the frame is read after it,
    and an estimated length counts the bytes after the tag only."""
    tag = id3(200_000)
    data = tag + mp3(frame())
    found = read(data)
    assert found is not None and found.start == len(tag)
    assert found.seconds(len(data)) == pytest.approx((len(data) - len(tag)) * 8 / 128000)


def test_no_frame_right_after_the_tag_is_no_frame() -> None:
    """libav looks for a frame count in that frame only: bytes before it hide the count."""
    assert read(id3(100) + b"junk" + mp3(frame(xing()))) is None
    assert not headers.length_is_exact("mp3", io.BytesIO(id3(100) + b"junk" + frame(xing())))
    assert read(b"\xff\xe0\x00\x00" + bytes(100)) is None  # a reserved layer


def test_a_count_cut_short_is_no_length_and_not_exact() -> None:
    data = FRAME_HEADER + bytes(SIDE) + b"Xing\x00\x00\x00\x01\x00\x00"
    with pytest.raises(struct.error):
        read(data)
    assert headers.seconds(io.BytesIO(data), len(data), "mp3", data) is None
    assert not headers.length_is_exact("mp3", io.BytesIO(data))


@pytest.mark.parametrize(
    ("names", "exact"),
    [("wav", True), ("flac", True), ("mov,mp4,m4a,3gp,3g2,mj2", True), ("matroska,webm", True),
     ("ogg", True), ("aac", False), ("asf", False), ("amr", False)],
)  # fmt: skip
def test_which_containers_state_their_length(names: str, exact: bool) -> None:
    assert headers.length_is_exact(names, io.BytesIO(b"")) is exact


# --- WAV -------------------------------------------------------------------------------------


def test_wav_in_pieces_is_the_same_file_as_whole() -> None:
    pcm = np.arange(-3000, 3000, 7, dtype="<i2").tobytes()
    whole = wav(pcm, 22050)
    assert wav([pcm[:100], pcm[100:1000], b"", pcm[1000:]], 22050) == whole
    assert whole[:4] == b"RIFF" and whole[8:16] == b"WAVEfmt " and len(whole) == 44 + len(pcm)
    with wave.open(io.BytesIO(whole)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 22050)
        assert w.readframes(w.getnframes()) == pcm


def test_an_empty_wav_is_a_valid_file() -> None:
    with wave.open(io.BytesIO(wav(b"", 16000))) as w:
        assert w.getnframes() == 0


# --- resampling ------------------------------------------------------------------------------


def sine(rate: int, seconds: float) -> npt.NDArray[np.int16]:
    t = np.arange(round(rate * seconds)) / rate
    return np.round(8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)


@pytest.mark.parametrize("fmt", ["s16", "flt"])
def test_a_stream_that_changes_rate_midway_keeps_its_length(fmt: str) -> None:
    """A chained Ogg or an MP3 that changes rate: the resampler starts afresh, after
    returning what the old one held, so no audio is lost or doubled."""
    resampler = Resampler(fmt)
    out = []
    for rate in (44100, 44100, 8000, 48000):
        out.append(resampler.feed(frame_of(sine(rate, 0.5), rate)))
    out.append(resampler.flush())
    samples = np.concatenate(out)
    assert samples.dtype == (np.int16 if fmt == "s16" else np.float32)
    assert abs(samples.size - 2 * RATE) <= 8, samples.size
    assert resampler.flush().size == 0  # flushed: nothing held


# --- VAD -------------------------------------------------------------------------------------


class Loudness:
    """Stands in for Silero: a frame's 'probability' is its peak, as the model was given it."""

    def __init__(self) -> None:
        self.resets = 0

    def probabilities(self, samples16k: npt.ArrayLike) -> npt.NDArray[np.float32]:
        x = np.asarray(samples16k, dtype=np.float32)
        frames = x[: x.size // vad.FRAME * vad.FRAME].reshape(-1, vad.FRAME)
        return np.abs(frames).max(axis=1)

    def reset(self) -> None:
        self.resets += 1


def test_probabilities_see_the_gain_clipped_and_start_afresh() -> None:
    model = Loudness()
    quiet = np.full(2 * vad.FRAME, 1000, dtype=np.int16)
    assert vad.probabilities([quiet], model).tolist() == pytest.approx([1000 / 32768] * 2)
    assert vad.probabilities([quiet, quiet], model, gain=100.0).tolist() == [1.0] * 4
    assert model.resets == 2


def test_the_gain_brings_loud_frames_to_one_level_within_bounds() -> None:
    level = 0.02  # RMS of a square wave of that amplitude
    square = np.tile([655, -655], 10 * vad.FRAME).astype(np.int16)
    assert vad.normalizing_gain([square]) == pytest.approx(vad.NORMALIZE_LEVEL / level, rel=0.01)
    assert vad.normalizing_gain([np.zeros(4 * vad.FRAME, np.int16)]) == 1.0  # digital silence
    assert vad.normalizing_gain([np.ones(4 * vad.FRAME, np.int16)]) == 100.0  # at most x100
    assert vad.normalizing_gain([np.full(vad.FRAME, 32767, np.int16)]) == pytest.approx(
        0.25, rel=1e-3
    )
    assert vad.normalizing_gain([np.full(vad.FRAME - 1, 32767, np.int16)]) == 1.0  # no frame


def test_silence_lies_below_the_threshold_by_silero_s_hysteresis() -> None:
    assert vad.neg_threshold(0.5) == pytest.approx(0.35)
    assert vad.neg_threshold(0.1) == 0.01
