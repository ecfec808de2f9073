"""Encoding: 16-bit mono PCM written as a file in memory -- WAV (the one WAV writer of the
repository: the gateway's and test support's) or FLAC (lossless, about half the size).

`wav` needs the standard library only (test support imports it without PyAV or numpy);
`flac` loads PyAV when it is called.
"""

from __future__ import annotations

import io
import wave
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


def wav(pcm16: bytes | Iterable[bytes], rate: int) -> bytes:
    """A mono 16-bit WAV file of `pcm16` (little-endian samples, whole or in pieces) at
    `rate` samples per second."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        for piece in [pcm16] if isinstance(pcm16, bytes | bytearray) else pcm16:
            w.writeframes(piece)
    return buf.getvalue()


def flac(blocks: Iterable[npt.NDArray[np.int16]], rate: int) -> bytes:
    """A mono 16-bit FLAC file of the samples in `blocks` at `rate` samples per second."""
    import av

    from .pcm import frame_of

    buf = io.BytesIO()
    with av.open(buf, "w", format="flac") as out:
        stream = out.add_stream("flac", rate=rate, layout="mono", format="s16")
        pts = 0
        for block in blocks:
            frame = frame_of(block, rate)
            frame.pts = pts
            pts += block.size
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()


def encode(blocks: Iterable[npt.NDArray[np.int16]], rate: int, fmt: str = "flac") -> bytes:
    """The samples in `blocks` as a `fmt` ("flac" or "wav") file."""
    if fmt == "wav":
        return wav((block.tobytes() for block in blocks), rate)
    if fmt != "flac":
        raise ValueError(f"audio is encoded as flac or wav, not {fmt!r}")
    return flac(blocks, rate)
