"""The gateway's audio sniffing: container and duration from headers, checked on real files
encoded by ffmpeg and sox, and on hostile bytes."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.audio import require_tools, tone_wav
from transcription_api.errors import APIError
from transcription_api.multipart import FILE_HEAD
from transcription_frontend.sniff import (
    PCM_BITS_PER_SECOND,
    TYPICAL_BITS_PER_SECOND,
    AudioInfo,
    audio_seconds,
    audio_seconds_from_head,
    probe,
)

SECONDS = 41.5
# ffmpeg arguments per file, and the container the gateway should name.
ENCODINGS = {
    "a.wav": ([], "wav"),
    "a.rf64.wav": (["-rf64", "always"], "wav"),
    "a.flac": ([], "flac"),
    "a.mp3": (["-c:a", "libmp3lame", "-b:a", "64k"], "mp3"),  # Xing header
    "a.vbr.mp3": (["-c:a", "libmp3lame", "-q:a", "4"], "mp3"),
    "a.cbr.mp3": (["-c:a", "libmp3lame", "-b:a", "128k", "-write_xing", "0",
                   "-id3v2_version", "0"], "mp3"),  # no frame count: size over bitrate
    "a.ogg": (["-c:a", "libvorbis"], "ogg"),
    "a.opus": (["-c:a", "libopus"], "ogg"),
    "a.aiff": ([], "aiff"),
    "a.au": ([], "au"),
    "a.m4a": (["-c:a", "aac"], "mp4"),
    "a.webm": (["-c:a", "libopus"], "webm"),
}  # fmt: skip
NO_DURATION = {"mp4", "webm"}  # their length sits in an index the gateway does not read


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    require_tools()
    d = tmp_path_factory.mktemp("sniff")
    wav = d / "source.wav"
    # Stereo 44.1 kHz, so that no header field happens to equal a 16 kHz mono default.
    subprocess.run(["sox", "-n", "-r", "44100", "-c", "2", str(wav), "synth", str(SECONDS),
                    "sine", "440"], check=True)  # fmt: skip
    out = {}
    for name, (args, _) in ENCODINGS.items():
        out[name] = d / name
        subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(wav), *args,
                        str(d / name)], check=True)  # fmt: skip
    return out


@pytest.mark.parametrize("name", ENCODINGS)
def test_container_and_duration_from_the_header(files: dict[str, Path], name: str) -> None:
    data = files[name].read_bytes()
    info = probe(io.BytesIO(data), len(data))
    assert info.container == ENCODINGS[name][1]
    if info.container in NO_DURATION:
        assert info.seconds is None
    else:
        # Encoders pad to whole frames (MP3: a frame of 1152 samples, plus the decoder delay).
        assert info.seconds == pytest.approx(SECONDS, abs=0.1), name


def test_a_wav_whose_header_claims_more_than_the_file_holds() -> None:
    """Streaming writers leave the size unknown (0xFFFFFFFF) or wrong: what is there counts."""
    wav = bytearray(tone_wav(2.0))
    wav[40:44] = b"\xff\xff\xff\xff"
    assert probe(io.BytesIO(bytes(wav)), len(wav)).seconds == pytest.approx(2.0)
    cut = bytes(tone_wav(2.0)[: 44 + 16000])
    assert probe(io.BytesIO(cut), len(cut)).seconds == pytest.approx(0.5)


@pytest.mark.parametrize(
    "head",
    [
        b"RIFF",
        b"RIFF\x00\x00\x00\x00WAVEfmt ",
        b"fLaC\x00",
        b"OggS" + b"\x00" * 30,
        b"ID3\x04\x00\x00\x7f\x7f\x7f\x7f",
        b"\xff\xfb\x90",
        b"FORM\x00\x00\x00\x04AIFF",
        b".snd\x00\x00\x00\x18",
    ],
)
def test_truncated_headers_give_no_duration_not_an_error(head: bytes) -> None:
    info = probe(io.BytesIO(head), len(head))
    assert info.container in ("wav", "flac", "ogg", "mp3", "aiff", "au")
    assert info.seconds is None or info.seconds < 1


def test_no_container_is_a_400() -> None:
    with pytest.raises(APIError, match="not a recognised audio or video container"):
        probe(io.BytesIO(b"hello world"), 11)


@given(head=st.sampled_from([b"RIFF", b"RF64", b"fLaC", b"OggS", b"ID3", b"FORM", b".snd",
                             b"\xff\xfb", b"\xff\xf1", b""]), rest=st.binary(max_size=300))  # fmt: skip
@settings(max_examples=500, deadline=None)
def test_any_bytes_give_an_answer_or_a_400(head: bytes, rest: bytes) -> None:
    data = head + rest
    try:
        info = probe(io.BytesIO(data), len(data))
    except APIError as e:
        status = e.status
    else:
        status = 200
        assert info.seconds is None or 0 <= info.seconds < 1e7
    assert status in (200, 400)


# --------------------------------------------------------------------------- autoscaling's length

ESTIMATED = {"ogg", "mp4", "webm"}  # Ogg's length is on its last page, the others' in an index


@pytest.mark.parametrize("name", ENCODINGS)
def test_the_length_from_the_first_4_kib_while_the_upload_arrives(
    files: dict[str, Path], name: str
) -> None:
    """What autoscaling counts for an upload still arriving: its header's length, else an
    estimate from the request's size (a little more than the file's) at the container's
    typical bit rate."""
    data = files[name].read_bytes()
    size = len(data) + 300  # the Content-Length: the form around the file too
    container = ENCODINGS[name][1]
    seconds = audio_seconds_from_head(data[:FILE_HEAD], size)
    if container in ESTIMATED:
        assert seconds == size * 8 / TYPICAL_BITS_PER_SECOND[container]
    else:
        assert seconds == pytest.approx(SECONDS, abs=0.2), name
    # Once the whole file is there, the length `check_audio` reads (Ogg's exact now).
    whole = audio_seconds(probe(io.BytesIO(data), len(data)), len(data))
    if container in NO_DURATION:
        assert whole == len(data) * 8 / TYPICAL_BITS_PER_SECOND[container]
    else:
        assert whole == pytest.approx(SECONDS, abs=0.1), name


def test_a_file_of_no_known_container_is_estimated_as_pcm() -> None:
    assert audio_seconds(AudioInfo("riff"), 64_000) == 64_000 * 8 / PCM_BITS_PER_SECOND == 2.0
    assert audio_seconds_from_head(b"not audio at all", 10_000) is None


@given(head=st.sampled_from([b"RIFF", b"RF64", b"fLaC", b"OggS", b"ID3", b"FORM", b".snd",
                             b"\xff\xfb", b"\xff\xf1", b""]), rest=st.binary(max_size=300),
       size=st.integers(min_value=0, max_value=2**32))  # fmt: skip
@settings(max_examples=300, deadline=None)
def test_any_head_gives_a_length_or_none(head: bytes, rest: bytes, size: int) -> None:
    seconds = audio_seconds_from_head(head + rest, size)
    assert seconds is None or seconds >= 0
