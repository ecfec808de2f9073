"""Long audio decoded (transcription_frontend.audio.decode) and cut on silence
(transcription_frontend.longaudio.cut), on real audio: a 3.5-minute espeak-ng recording
whose sentences lie at known places, in every container the gateway takes; damaged files;
an hour-long file for memory."""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest

from testkit.audio import SENTENCES, convert
from testkit.longaudio import Recording, babble, damaged, long_recording, looped, read_wav, tone
from transcription_frontend.audio import vad
from transcription_frontend.audio.decode import CorruptAudio, Decoded, decode
from transcription_frontend.audio.encode import wav
from transcription_frontend.longaudio.cut import (
    Chunk,
    ChunkSettings,
    choose_cuts,
    encode,
    find_cuts,
    speech_probabilities,
)

FORMATS = ["wav", "flac", "mp3", "ogg", "m4a", "webm"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("longaudio")


@pytest.fixture(scope="module")
def recording(workdir: Path) -> Recording:
    """3.5 minutes: 50 sentences, pauses of 0.3-1.5 s between them."""
    return long_recording(workdir / "speech", 210.0)


@pytest.fixture(scope="module")
def decoded(recording: Recording) -> Iterator[Decoded]:
    with decode(recording.wav) as d:
        yield d


def check_chunks(chunks: list[Chunk], seconds: float, settings: ChunkSettings) -> None:
    """Contiguous, numbered in order, covering the whole audio, none over the maximum."""
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert chunks[0].start == 0.0
    assert chunks[-1].end == seconds
    for before, after in itertools.pairwise(chunks):
        assert before.end == after.start
    for c in chunks:
        assert 0 < c.seconds <= settings.max_chunk_seconds, c


# --- decoding -------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_container_decodes_to_the_same_length(
    recording: Recording, decoded: Decoded, fmt: str, tmp_path: Path
) -> None:
    source = convert(recording.wav, fmt)
    with decode(source, spool_dir=tmp_path) as d:
        assert abs(d.seconds - recording.seconds) < 0.1, (fmt, d.seconds, recording.seconds)
        assert d.pcm.parent == tmp_path
        assert d.pcm.stat().st_size == d.samples * 2
        if fmt in ("wav", "flac"):  # lossless: the very samples
            assert d.pcm.read_bytes() == read_wav(recording.wav).tobytes()
    assert not list(tmp_path.iterdir())  # close() removed the spool


def test_an_open_file_decodes_like_its_path(recording: Recording, tmp_path: Path) -> None:
    """The gateway hands over its spooled upload, a file object, wherever its position."""
    mp3 = convert(recording.wav, "mp3")
    with tempfile.SpooledTemporaryFile() as upload:
        upload.write(mp3.read_bytes())  # left at its end
        with decode(upload) as from_file, decode(mp3) as from_path:
            assert from_file.pcm.read_bytes() == from_path.pcm.read_bytes()
    truncated = damaged(mp3, tmp_path / "half.mp3", 0.5, garbage=None)
    with truncated.open("rb") as f, pytest.raises(CorruptAudio, match="truncated"):
        decode(f)  # the Xing header is found through the file object too


def test_other_rates_and_layouts_become_16k_mono(recording: Recording, tmp_path: Path) -> None:
    stereo = tmp_path / "stereo44.flac"
    subprocess.run(
        ["ffmpeg", "-loglevel", "error", "-i", str(recording.wav), "-ar", "44100", "-ac", "2",
         str(stereo)],
        check=True,
    )  # fmt: skip
    with decode(stereo) as d, decode(recording.wav) as original:
        assert abs(d.seconds - recording.seconds) < 0.01
        a = np.frombuffer(d.pcm.read_bytes(), "<i2").astype(np.float64)
        b = np.frombuffer(original.pcm.read_bytes(), "<i2").astype(np.float64)
        n = min(a.size, b.size)
        assert np.corrcoef(a[:n], b[:n])[0, 1] > 0.99  # the same audio, back at 16 kHz


# --- cutting ---------------------------------------------------------------------------------

SETTINGS = {
    "default": ChunkSettings(),
    "15s": ChunkSettings(max_chunk_seconds=15, target_chunk_seconds=12),
    "10s-short-silences": ChunkSettings(
        max_chunk_seconds=10, target_chunk_seconds=8, silence_duration_ms=300
    ),
    "normalized": ChunkSettings(normalize=True),
}


@pytest.mark.parametrize("name", SETTINGS)
def test_cuts_fall_in_pauses_never_in_a_sentence(
    recording: Recording, decoded: Decoded, name: str
) -> None:
    settings = SETTINGS[name]
    chunks = find_cuts(decoded, settings)
    check_chunks(chunks, decoded.seconds, settings)
    assert len(chunks) >= recording.seconds / settings.max_chunk_seconds
    for c in chunks[:-1]:
        pause = recording.pause_at(c.end)
        assert pause is not None, f"{name}: chunk {c.index} ends in {recording.sentence_at(c.end)}"
        # not at a pause's very edge either: Silero's silence is where the pause is
        assert min(c.end - pause[0], pause[1] - c.end) > 0.1, (name, c, pause)


def test_cuts_prefer_the_longest_pause_in_reach(recording: Recording, decoded: Decoded) -> None:
    settings = ChunkSettings()
    chunks = find_cuts(decoded, settings)
    for c in chunks[:-1]:
        low, high = c.start + settings.window_seconds, c.start + settings.max_chunk_seconds
        reach = [min(b, high) - max(a, low) for a, b in recording.pauses() if b > low and a < high]
        chosen = recording.pause_at(c.end)
        assert chosen is not None
        length = min(chosen[1], high) - max(chosen[0], low)
        assert length >= max(reach) - 0.2, (c, chosen, sorted(reach))


def test_long_pauses_win_over_short_ones(workdir: Path) -> None:
    """Pauses alternate 0.3 s and 1.2 s; a silence counts from 800 ms, and every window
    (12 s) holds a long pause: every cut is in one."""
    rec = long_recording(
        workdir / "speech", 150.0, pause_list=[0.3, 1.2], sentences=SENTENCES, name="alternating"
    )
    settings = ChunkSettings(max_chunk_seconds=20, target_chunk_seconds=16, silence_duration_ms=800)
    with decode(rec.wav) as d:
        chunks = find_cuts(d, settings)
    check_chunks(chunks, d.seconds, settings)
    for c in chunks[:-1]:
        pause = rec.pause_at(c.end)
        assert pause is not None and pause[1] - pause[0] > 1.0, (c, pause)


@pytest.mark.parametrize("kind", ["babble", "tone"])
def test_audio_without_silence_is_still_cut_within_the_maximum(workdir: Path, kind: str) -> None:
    """Three voices talking at once (Silero: speech in 99.9% of frames), or a steady tone
    (no speech, no silence): 70 s still comes in chunks of at most 30 s."""
    path = babble(workdir / "speech", 70.0) if kind == "babble" else tone(workdir, 70.0)
    settings = ChunkSettings()
    with decode(path) as d:
        chunks = find_cuts(d, settings)
        if kind == "babble":
            assert np.mean(speech_probabilities(d, settings) >= settings.threshold) > 0.99
    check_chunks(chunks, 70.0, settings)


def test_quiet_speech_needs_normalizing(workdir: Path) -> None:
    """Speech 60 dB down: Silero hears none of it until the loudness is normalised, and
    then every cut is in a pause again."""
    rec = long_recording(workdir / "speech", 120.0, gain_db=-60, noise_dbfs=None, name="quiet")
    with decode(rec.wav) as d:
        plain = speech_probabilities(d, ChunkSettings())
        normalized = ChunkSettings(normalize=True)
        loud = speech_probabilities(d, normalized)
        chunks = find_cuts(d, normalized)
    frames = (np.arange(plain.size) + 0.5) * vad.FRAME_MS / 1000
    speaking = np.array([rec.sentence_at(t) is not None for t in frames])
    assert np.mean(plain[speaking] >= 0.5) < 0.1
    assert np.mean(loud[speaking] >= 0.5) > 0.85
    check_chunks(chunks, d.seconds, normalized)
    assert all(rec.pause_at(c.end) is not None for c in chunks[:-1])


def test_short_audio_is_one_chunk(tmp_path: Path) -> None:
    for seconds in (0.0, 3.0, 30.0):
        path = tmp_path / f"{seconds}.wav"
        path.write_bytes(wav(bytes(2 * round(seconds * 16000)), 16000))
        with decode(path) as d:
            assert find_cuts(d, ChunkSettings()) == [Chunk(0, 0.0, seconds)]


# The rules, on probabilities made up frame by frame (32 ms each): 40 s of audio, so one cut,
# sought from 17 s (frame 531.25) to 30 s (frame 937.5) with the default settings.


def frames_to_samples(frames: float) -> int:
    return round(frames * vad.FRAME)


def one_cut(probabilities: np.ndarray, settings: ChunkSettings | None = None) -> float:
    chunks = choose_cuts(probabilities.astype(np.float32), 40 * 16000, settings or ChunkSettings())
    assert len(chunks) == 2
    return chunks[0].end * 16000 / vad.FRAME  # in frames


def test_rule_longest_long_silence() -> None:
    p = np.full(1250, 0.9)
    p[600:620] = 0.1  # 640 ms of silence
    p[800:840] = 0.1  # 1280 ms: the longest
    p[700:705] = 0.4  # a short dip below the threshold
    assert one_cut(p) == 820


def test_rule_short_silence_beats_none_and_the_longest_short_one_wins() -> None:
    p = np.full(1250, 0.9)
    p[600] = 0.2  # one frame below the threshold
    p[700:704] = 0.45  # four frames below the threshold, above threshold - 0.15
    p[720] = 0.05
    assert one_cut(p) == 702


def test_rule_no_silence_cuts_at_the_least_speech() -> None:
    p = np.full(1250, 0.95)
    p[650] = 0.6
    p[300] = 0.01  # before the window: not a candidate
    p[1000] = 0.01  # after it
    assert one_cut(p) == 650.5  # the middle of the frame


def test_rule_ties_go_to_the_one_nearest_the_target() -> None:
    p = np.full(1250, 0.9)
    p[560:580] = 0.1
    p[770:790] = 0.1  # 25 s = frame 781.25: nearer
    p[900:920] = 0.1
    assert one_cut(p) == 780


def test_rule_silence_straddling_the_window_counts_inside_it() -> None:
    p = np.full(1250, 0.9)
    p[900:1100] = 0.1  # runs past 30 s: only frames 900-937 are in reach
    p[600:630] = 0.1  # 30 frames: shorter than what is in reach of the other
    cut_at = one_cut(p)
    assert cut_at == (900 + 937) / 2 and cut_at * vad.FRAME <= 30 * 16000


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="target_chunk_seconds"):
        ChunkSettings(max_chunk_seconds=10, target_chunk_seconds=20)
    with pytest.raises(ValueError, match="threshold"):
        ChunkSettings(threshold=1.5)
    assert ChunkSettings().window_seconds == 17.0
    assert ChunkSettings(max_chunk_seconds=8, target_chunk_seconds=6).window_seconds == 2.0


# --- damaged and foreign files ----------------------------------------------------------------

DAMAGE = [
    ("mp3", "garbage"), ("mp3", "cut"), ("flac", "garbage"), ("flac", "cut"),
    ("ogg", "garbage"), ("m4a", "garbage"), ("webm", "garbage"), ("webm", "cut"),
]  # fmt: skip


@pytest.mark.parametrize(("fmt", "damage"), DAMAGE)
@pytest.mark.parametrize("at", [0.3, 0.7])
def test_damage_midway_names_its_offset(
    recording: Recording, fmt: str, damage: str, at: float, tmp_path: Path
) -> None:
    source = damaged(
        convert(recording.wav, fmt),
        tmp_path / f"damaged.{fmt}",
        at,
        garbage=20000 if damage == "garbage" else None,
    )
    spool = tmp_path / "spool"
    spool.mkdir()
    with pytest.raises(CorruptAudio) as caught:
        decode(source, spool_dir=spool)
    expected = at * recording.seconds  # the bytes are spread evenly enough over the time
    offset = caught.value.offset_seconds
    assert abs(offset - expected) < 3.0, (offset, expected, str(caught.value))
    assert f"after {offset:.1f} s" in str(caught.value)
    assert not list(spool.iterdir())  # the partial spool is gone


def test_a_truncated_m4a_with_its_index_at_the_end_is_unreadable(
    recording: Recording, tmp_path: Path
) -> None:
    source = damaged(convert(recording.wav, "m4a"), tmp_path / "cut.m4a", 0.5, garbage=None)
    with pytest.raises(CorruptAudio) as caught:
        decode(source)
    assert caught.value.offset_seconds == 0.0
    assert "from its start" in str(caught.value)


def test_lengths_estimated_from_the_bit_rate_are_not_taken_for_truncation(
    recording: Recording, tmp_path: Path
) -> None:
    """A VBR MP3 without a Xing header: ffmpeg guesses its length from the first frame's
    bit rate (wrongly), and the file is still whole."""
    vbr = tmp_path / "vbr.mp3"
    subprocess.run(
        ["ffmpeg", "-loglevel", "error", "-i", str(recording.wav), "-c:a", "libmp3lame",
         "-q:a", "2", "-write_xing", "0", str(vbr)],
        check=True,
    )  # fmt: skip
    with av.open(str(vbr)) as c:
        guessed = (c.duration or 0) / 1e6
    with decode(vbr) as d:
        assert abs(d.seconds - recording.seconds) < 0.1
    assert abs(guessed - recording.seconds) > 1.0  # what a naive check would have trusted


@pytest.mark.parametrize("content", ["text", "random", "empty", "image"])
def test_what_is_not_audio_fails_at_zero(content: str, tmp_path: Path) -> None:
    path = tmp_path / f"upload.{content}"
    if content == "image":
        subprocess.run(
            ["ffmpeg", "-loglevel", "error", "-f", "lavfi", "-i", "color=c=red:s=16x16",
             "-frames:v", "1", str(path.with_suffix(".png"))],
            check=True,
        )  # fmt: skip
        path = path.with_suffix(".png")
    else:
        data = {"text": b"not audio at all\n" * 200, "random": os.urandom(50000), "empty": b""}
        path.write_bytes(data[content])
    with pytest.raises(CorruptAudio) as caught:
        decode(path)
    assert caught.value.offset_seconds == 0.0
    assert str(caught.value).startswith("the audio cannot be decoded from its start: ")


# --- encoding ---------------------------------------------------------------------------------


def pcm_of(decoded: Decoded, chunk: Chunk) -> np.ndarray:
    first, last = round(chunk.start * 16000), round(chunk.end * 16000)
    return np.concatenate(list(decoded.blocks(first, last)))


def test_flac_chunks_decode_back_to_the_same_samples(decoded: Decoded) -> None:
    chunks = find_cuts(decoded, ChunkSettings())
    for chunk in (chunks[0], chunks[3], chunks[-1]):
        data = encode(decoded, chunk)
        assert data[:4] == b"fLaC"
        with av.open(io.BytesIO(data), mode="r") as container:
            stream = container.streams.audio[0]
            assert (stream.codec_context.name, stream.sample_rate) == ("flac", 16000)
            assert stream.codec_context.layout.name == "mono"
            samples = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
        expected = pcm_of(decoded, chunk)
        assert samples.dtype == np.int16
        np.testing.assert_array_equal(samples, expected)  # lossless: exactly
        # smaller than the PCM: 65% here, where a -60 dBFS noise floor fills every pause
        assert len(data) < 0.75 * expected.size * 2


def test_wav_chunks_hold_the_same_samples(decoded: Decoded) -> None:
    chunk = find_cuts(decoded, ChunkSettings())[1]
    with wave.open(io.BytesIO(encode(decoded, chunk, "wav"))) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
        samples = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    np.testing.assert_array_equal(samples, pcm_of(decoded, chunk))
    with pytest.raises(ValueError, match="flac or wav"):
        encode(decoded, chunk, "mp3")


# --- an hour ----------------------------------------------------------------------------------

# Peak memory from /proc: getrusage's ru_maxrss would keep the peak of the pytest process
# this one was forked from (Linux carries it over exec), hiding everything below it.
# The gateway's main holds glibc's heap steady first (transcription_frontend.heap), and so
# does this process.
MEASURE = """
import json, sys, time
from pathlib import Path
from transcription_frontend import heap
assert heap.hold_steady()
from transcription_frontend.audio.decode import decode
from transcription_frontend.longaudio.cut import Chunk, ChunkSettings, encode, find_cuts

def status_mb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise LookupError(field)

def peak_mb():
    return status_mb("VmHWM")

with decode(Path(sys.argv[2])) as d:  # warm up: libraries loaded, Silero's session made
    find_cuts(d, ChunkSettings(max_chunk_seconds=5, target_chunk_seconds=4))
    encode(d, Chunk(0, 0.0, d.seconds))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak starts over from here
base = status_mb("VmRSS")
started = time.perf_counter()
with decode(Path(sys.argv[1])) as d:
    decoded_at, decode_mb = time.perf_counter(), peak_mb()
    chunks = find_cuts(d, ChunkSettings())
    cut_at, cut_mb = time.perf_counter(), peak_mb()
    sizes = [len(encode(d, c)) for c in chunks[:10]]
    print(json.dumps({
        "seconds": d.seconds, "chunks": len(chunks),
        "longest": max(c.seconds for c in chunks),
        "decode_s": decoded_at - started, "cut_s": cut_at - decoded_at,
        "base_mb": base, "decode_mb": decode_mb - base, "cut_mb": cut_mb - base, "total_mb": peak_mb() - base,
        "flac_bytes": max(sizes),
    }))
"""


def test_an_hour_decodes_and_cuts_in_bounded_memory(recording: Recording, workdir: Path) -> None:
    """An hour of MP3 (a 10 s clip looped, packets copied): decode, Silero over all of it
    and ten FLAC chunks add under 60 MB to the process's peak (the PCM alone is 115 MB)."""
    clip = workdir / "clip.mp3"
    subprocess.run(
        ["ffmpeg", "-loglevel", "error", "-y", "-i", str(recording.wav), "-t", "10",
         "-c:a", "libmp3lame", "-b:a", "64k", str(clip)],
        check=True,
    )  # fmt: skip
    hour = looped(clip, 3600, workdir / "hour.mp3")
    root = Path(__file__).resolve().parents[1]
    sources = [root / "api", root / "frontend_image", root]  # this checkout's, not an install's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, sources))}
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(hour), str(clip)],
        check=True, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    result = json.loads(out.stdout)
    print(f"1 hour of MP3: {result} ({time.perf_counter() - started:.1f} s with start-up)")
    assert abs(result["seconds"] - 3600) < 1
    assert result["longest"] <= 30
    assert result["chunks"] >= 120
    assert result["total_mb"] < 60, result
    assert result["flac_bytes"] < 700_000  # a 30 s chunk is about half a megabyte
