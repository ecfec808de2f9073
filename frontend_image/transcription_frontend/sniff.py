"""Audio sniffing: refuse what no engine can decode before a worker is busy with it."""

from __future__ import annotations

from transcription_api.errors import bad_request
from transcription_api.multipart import Upload

# Leading bytes of the containers Whisper engines decode (and a few more ffmpeg reads).
AUDIO_MAGIC: tuple[tuple[int, bytes], ...] = (
    (0, b"RIFF"),
    (0, b"RF64"),
    (0, b"fLaC"),
    (0, b"OggS"),
    (0, b"ID3"),
    (0, b"\x1a\x45\xdf\xa3"),
    (4, b"ftyp"),
    (0, b"#!AMR"),
    (0, b"FORM"),
    (0, b".snd"),
    (0, b"caff"),
    (0, b"\x30\x26\xb2\x75"),
)


def looks_like_audio(head: bytes) -> bool:
    if any(head[off : off + len(magic)] == magic for off, magic in AUDIO_MAGIC):
        return True
    # MPEG audio (mp3, aac/adts) frames start with 11 set bits.
    return len(head) >= 2 and head[0] == 0xFF and (head[1] & 0xE0) == 0xE0


def check_audio(upload: Upload) -> None:
    """Raise 400 for an empty file or one that is no audio container."""
    if upload.size == 0:
        raise bad_request("the uploaded file is empty", param="file", code="empty_file")
    assert upload.file is not None
    head = upload.file.read(16)
    upload.file.seek(0)
    if not looks_like_audio(head):
        raise bad_request(
            "the file is not a recognised audio or video container (wav, mp3, flac, "
            "ogg, webm, m4a, mp4 ...)",
            param="file",
            code="invalid_audio",
        )
