"""When the gateway chunks long audio, and how (flags of the frontend, from
`spec.frontend.chunking` and `spec.frontend.maxAudioSeconds`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transcription_api.frontend import ChunkingSpec

_D = ChunkingSpec()


@dataclass(frozen=True)
class Chunking:
    enabled: bool = _D.enabled
    # audio longer than this is chunked when its length is known from its header
    threshold_seconds: float = _D.threshold_seconds
    max_chunk_seconds: float = _D.max_chunk_seconds
    max_parallel: int = _D.max_parallel_chunks  # chunks of one request at once
    previous_text: bool = _D.previous_text  # each chunk prompted with the one before's text
    max_audio_seconds: float | None = None  # longer: 413 naming spec.frontend.maxAudioSeconds


def chunking_args(parser: Any) -> None:
    """The flags of the chunking settings (main.py); the resource's defaults are theirs."""
    g = parser.add_argument_group("long audio (spec.frontend.chunking, maxAudioSeconds)")
    g.add_argument("--no-chunking", action="store_true",
                   help="send long audio whole (chunking_strategy still chunks)")  # fmt: skip
    g.add_argument("--chunk-threshold", type=float, default=_D.threshold_seconds,
                   help="chunk audio longer than this many seconds")  # fmt: skip
    g.add_argument("--max-chunk-seconds", type=float, default=_D.max_chunk_seconds,
                   help="longest chunk")  # fmt: skip
    g.add_argument("--max-parallel-chunks", type=int, default=_D.max_parallel_chunks,
                   help="chunks of one request at once")  # fmt: skip
    g.add_argument("--chunk-previous-text", action="store_true",
                   help="prompt each chunk with the text of the one before")  # fmt: skip
    g.add_argument("--max-audio-seconds", type=float, default=None,
                   help="longest audio accepted; longer: 413")  # fmt: skip


def chunking_of(args: Any) -> Chunking:
    return Chunking(
        enabled=not args.no_chunking,
        threshold_seconds=args.chunk_threshold,
        max_chunk_seconds=args.max_chunk_seconds,
        max_parallel=args.max_parallel_chunks,
        previous_text=args.chunk_previous_text,
        max_audio_seconds=args.max_audio_seconds,
    )
