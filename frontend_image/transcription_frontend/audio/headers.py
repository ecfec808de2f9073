"""Container headers: which container an upload is, how long it plays, and whether that
length is exact -- read from its first and last bytes, nothing decoded.

`container` names the container from its leading bytes. `seconds` reads the length from
the header fields each format keeps it in (WAV/RF64 and AIFF, AU: data size and rate; FLAC:
STREAMINFO; Ogg Vorbis/Opus: the last page's granule position; MP3: the Xing/Info or VBRI
frame count, else the first frame's bitrate over the file size). Containers whose length
lives in an index that may sit anywhere (MP4/M4A, WebM, ASF) have none here.

`length_is_exact` says whether the length a file's header declares is counted (samples,
frames) rather than estimated from a bit rate, for the container names libav gives.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import IO

HEAD = 64 * 1024  # bytes read from the start (headers, the first MP3 frame)
TAIL = 64 * 1024  # ...and from the end (the last Ogg page)

# Leading bytes of the containers Whisper engines decode (and a few more ffmpeg reads), and
# the name `CapabilitySet.audio_formats` uses for each.
AUDIO_MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (0, b"RIFF", "wav"),
    (0, b"RF64", "wav"),
    (0, b"fLaC", "flac"),
    (0, b"OggS", "ogg"),
    (0, b"ID3", "mp3"),
    (0, b"\x1a\x45\xdf\xa3", "webm"),
    (4, b"ftyp", "mp4"),
    (0, b"#!AMR", "amr"),
    (0, b"FORM", "aiff"),
    (0, b".snd", "au"),
    (0, b"caff", "caf"),
    (0, b"\x30\x26\xb2\x75", "wma"),
)
# Containers (libav's demuxer names) whose header states the audio's length exactly, not
# estimated from a bit rate. MP3 is one only with a Xing/Info/VBRI frame count (`Mp3Frame`);
# raw AAC/ADTS and others are not.
EXACT_LENGTH_FORMATS = frozenset(
    {"flac", "mov", "mp4", "m4a", "matroska", "webm", "ogg", "wav", "w64", "aiff", "caf"}
)
# What a header this short or odd raises while it is read: no length, not an error.
_TRUNCATED = (struct.error, ValueError, IndexError, ZeroDivisionError, OverflowError)


def container(head: bytes) -> str | None:
    """The container the leading bytes name (a name of AUDIO_MAGIC, or "mp3"/"aac" for bare
    MPEG frames), or None for no audio container."""
    for off, magic, name in AUDIO_MAGIC:
        if head[off : off + len(magic)] == magic:
            if name == "wav" and head[8:12] not in (b"WAVE", b""):
                return "riff"  # AVI and other RIFF forms: still ffmpeg's to judge
            return name
    # MPEG audio frames start with 11 set bits; layer bits 00 mean AAC in ADTS framing.
    if len(head) >= 2 and head[0] == 0xFF and (head[1] & 0xE0) == 0xE0:
        return "aac" if head[1] & 0x06 == 0 else "mp3"
    return None


def seconds(f: IO[bytes], size: int, name: str, head: bytes) -> float | None:
    """How long the `size` bytes of `f`, a `name` container (`container`) whose first bytes
    are `head`, play by its header; None where the header does not say (cheaply), is cut
    short or is implausible."""
    reader = _DURATIONS.get(name)
    if reader is None:
        return None
    try:
        length = reader(f, head, size)
    except _TRUNCATED:
        return None  # a header this short or odd: the engine will judge the file
    return length if length is not None and 0 <= length < 1e7 else None


def length_is_exact(format_name: str, f: IO[bytes]) -> bool:
    """Whether the header of `f`, a file libav reads as `format_name` (its demuxer's names,
    comma-separated: "mov,mp4,m4a,3gp,3g2,mj2"), states the audio's length exactly, rather
    than libav estimating it from a bit rate."""
    names = set(format_name.split(","))
    if "mp3" not in names:
        return bool(names & EXACT_LENGTH_FORMATS)
    f.seek(0)
    try:
        frame = mp3_frame(f, f.read(HEAD))
    except _TRUNCATED:
        return False
    return frame is not None and frame.frames is not None


# --------------------------------------------------------------------------- durations


def _int(fmt: str, data: bytes) -> int:
    """One integer field (struct.error when `data` is too short: a truncated header)."""
    return int(struct.unpack(fmt, data)[0])


def _wav(f: IO[bytes], head: bytes, size: int) -> float | None:
    """RIFF/RF64 WAVE: the `data` chunk's size over `fmt `'s byte rate."""
    byte_rate = data_size = data_at = None
    ds64_size = None
    pos = 12
    while pos + 8 <= size and (byte_rate is None or data_size is None):
        f.seek(pos)
        header = f.read(8)
        if len(header) < 8:
            break
        cid, n = header[:4], _int("<I", header[4:])
        if cid == b"fmt ":
            byte_rate = _int("<I", f.read(12)[8:12])
        elif cid == b"ds64":
            ds64_size = _int("<Q", f.read(16)[8:16])
        elif cid == b"data":
            data_at, data_size = pos + 8, n
            if n == 0xFFFFFFFF:  # RF64, or a writer that did not know the length
                data_size = ds64_size
            break
        pos += 8 + n + (n & 1)
    if not byte_rate or data_at is None:
        return None
    available = size - data_at
    return min(data_size or available, available) / byte_rate


def _aiff(f: IO[bytes], head: bytes, size: int) -> float | None:
    """AIFF/AIFC: `COMM`'s frame count over its (80-bit float) sample rate."""
    pos = 12
    while pos + 8 <= min(size, len(head)):
        cid, n = head[pos : pos + 4], _int(">I", head[pos + 4 : pos + 8])
        if cid == b"COMM":
            frames = _int(">I", head[pos + 10 : pos + 14])
            exponent, mantissa = struct.unpack(">HQ", head[pos + 16 : pos + 26])
            rate = mantissa * 2.0 ** ((exponent & 0x7FFF) - 16383 - 63)
            return frames / rate if rate else None
        pos += 8 + n + (n & 1)
    return None


AU_SAMPLE_BYTES = {1: 1, 2: 1, 3: 2, 4: 3, 5: 4, 6: 4, 7: 8, 27: 1}


def _au(f: IO[bytes], head: bytes, size: int) -> float | None:
    offset, data_size, encoding, rate, channels = (int(x) for x in struct.unpack(">5I", head[4:24]))
    width = AU_SAMPLE_BYTES.get(encoding)
    if not width or not rate or not channels:
        return None
    available = size - offset
    n = available if data_size == 0xFFFFFFFF else min(data_size, available)
    return n / (width * rate * channels)


def _flac(f: IO[bytes], head: bytes, size: int) -> float | None:
    """STREAMINFO (always the first metadata block): total samples over the sample rate."""
    if head[4] & 0x7F != 0:
        return None
    bits = int.from_bytes(head[18:26], "big")
    rate, total = bits >> 44, bits & ((1 << 36) - 1)
    return total / rate if rate and total else None


def _ogg(f: IO[bytes], head: bytes, size: int) -> float | None:
    """The last page's granule position (samples) over the rate of the first packet's codec."""
    first_packet = 27 + head[26]
    packet = head[first_packet : first_packet + 19]
    if packet.startswith(b"\x01vorbis"):
        rate, skip = _int("<I", packet[12:16]), 0
    elif packet.startswith(b"OpusHead"):
        rate, skip = 48000, _int("<H", packet[10:12])
    else:
        return None
    f.seek(max(0, size - TAIL))
    tail = f.read(TAIL)
    last = tail.rfind(b"OggS")
    if last < 0 or last + 14 > len(tail):
        return None
    granule = _int("<q", tail[last + 6 : last + 14])
    return (granule - skip) / rate if granule >= 0 and rate else None


def _mp3(f: IO[bytes], head: bytes, size: int) -> float | None:
    frame = mp3_frame(f, head)
    return frame.seconds(size) if frame is not None else None


_DURATIONS = {"wav": _wav, "aiff": _aiff, "au": _au, "flac": _flac, "ogg": _ogg, "mp3": _mp3}


# --------------------------------------------------------------------------- MP3

# MPEG audio: kbit/s per bitrate index, by (MPEG-1?, layer); samples per second by version.
_BITRATES = {
    (True, 1): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (False, 3): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


@dataclass(frozen=True)
class Mp3Frame:
    """An MP3 file's first frame, where libav's demuxer reads it for the file's length:
    right after the ID3v2 tag, if any (libav looks for a frame count nowhere else)."""

    start: int  # its offset in the file
    rate: int  # samples per second
    samples: int  # samples per frame
    kbps: int  # its bit rate (0: free format)
    frames: int | None  # the file's frame count from a Xing/Info or VBRI header: exact

    def seconds(self, size: int) -> float | None:
        """The file's length: counted frames, else (`size` bytes) the first frame's bit rate
        over the file's size (an estimate, wrong for VBR)."""
        if self.frames is not None:
            return self.frames * self.samples / self.rate
        return (size - self.start) * 8 / (self.kbps * 1000) if self.kbps else None


def mp3_frame(f: IO[bytes], head: bytes) -> Mp3Frame | None:
    """The first frame of the MP3 file `f`, whose first bytes are `head`; None when no valid
    frame header follows the ID3v2 tag (or starts the file). struct.error when the frame's
    Xing/Info or VBRI header is cut short."""
    base = start = 0  # the offset of `head` in the file; the frame's in `head`
    if head.startswith(b"ID3"):
        if len(head) < 10:
            return None
        tag = head[6:10]  # synchsafe: 7 bits a byte
        start = 10 + ((tag[0] & 0x7F) << 21 | (tag[1] & 0x7F) << 14 | (tag[2] & 0x7F) << 7
                      | (tag[3] & 0x7F))  # fmt: skip
        if head[5] & 0x10:
            start += 10  # footer
        if start + 4 > len(head):
            f.seek(start)
            head, base, start = f.read(HEAD), start, 0
    b = head[start : start + 4]
    if len(b) < 4 or b[0] != 0xFF or b[1] & 0xE0 != 0xE0:
        return None
    version, layer_bits = (b[1] >> 3) & 3, (b[1] >> 1) & 3
    rate_index = (b[2] >> 2) & 3
    if version == 1 or layer_bits == 0 or rate_index == 3:
        return None  # reserved values: no MPEG audio frame
    mpeg1, layer = version == 3, 4 - layer_bits
    kbps = _BITRATES[(mpeg1, layer)][b[2] >> 4] if b[2] >> 4 < 15 else 0
    rate = _RATES[version][rate_index]
    samples = 384 if layer == 1 else 1152 if (layer == 2 or mpeg1) else 576
    return Mp3Frame(base + start, rate, samples, kbps, _frame_count(head, start, b, mpeg1))


def _frame_count(head: bytes, start: int, b: bytes, mpeg1: bool) -> int | None:
    """The frame count of a Xing/Info header (after the side information, with its frames
    flag set) or a VBRI header (32 bytes in) in the frame at `start` of `head`; struct.error
    when that header is cut short."""
    mono = b[3] >> 6 == 3
    side = (17 if mono else 32) if mpeg1 else (9 if mono else 17)
    xing = start + 4 + side
    if head[xing : xing + 4] in (b"Xing", b"Info") and _int(">I", head[xing + 4 : xing + 8]) & 1:
        return _int(">I", head[xing + 8 : xing + 12])
    vbri = start + 4 + 32
    if head[vbri : vbri + 4] == b"VBRI":
        return _int(">I", head[vbri + 14 : vbri + 18])
    return None
