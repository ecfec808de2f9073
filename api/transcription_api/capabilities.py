"""What each (engine, mode) pair can serve, and what a request needs: the one definition
every component reads.

The operator turns the traffic a resource declares into needs (`traffic_needs`) and adds a
sequential pool when no pool covers one (the automatic split); the frontend turns each
request into needs (`request_needs`), routes it to a pool whose set covers them, and names
the missing capability in a 400 when none can. Upload limits come from here too.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from .openai import Granularity, ResponseFormat


class Engine(StrEnum):
    """Inference engine of a pool."""

    VLLM = "vllm"
    FASTER_WHISPER = "faster-whisper"
    TRANSFORMERS = "transformers"


class Mode(StrEnum):
    """Batching mode of a pool."""

    CONTINUOUS = "continuous"
    SEQUENTIAL = "sequential"


class Capability(StrEnum):
    """One thing a request can need from a pool. The value is what error messages name."""

    TRANSCRIPTIONS = "transcriptions"
    TRANSLATIONS = "translations"
    STREAM = "stream"
    SEGMENT_TIMESTAMPS = "segment_timestamps"
    WORD_TIMESTAMPS = "word_timestamps"
    LANGUAGE_DETECTION = "language_detection"


class CapabilitySet(BaseModel):
    """What a pool serves and its limits."""

    model_config = ConfigDict(frozen=True)

    capabilities: frozenset[Capability] = Field(
        description="Endpoints and options the pool serves."
    )
    max_upload_bytes: int | None = Field(
        default=None, description="Largest upload the engine accepts (None: no limit)."
    )
    max_concurrency: int | None = Field(
        default=None, description="Requests one replica runs at once (None: engine batches)."
    )
    native_formats: frozenset[str] = Field(
        description="response_format values the engine renders itself; the frontend renders "
        "the others (text from the transcript, srt/vtt/json from segments)."
    )
    stream_dialect: str = Field(
        default="openai-chunk",
        description="Shape of the engine's stream: 'openai-chunk' (vLLM's transcription.chunk "
        "events) or 'raw-text' (bare text deltas, transformers serve).",
    )

    def missing(self, needs: frozenset[Capability]) -> frozenset[Capability]:
        return needs - self.capabilities

    def covers(self, needs: frozenset[Capability]) -> bool:
        return not self.missing(needs)


C = Capability
VLLM_MAX_UPLOAD = 25 * 1024 * 1024  # vLLM's VLLM_MAX_AUDIO_CLIP_FILESIZE_MB default
# The CPU worker spools uploads to disk and decodes them as a stream: the largest upload
# the CRD lets a frontend accept (spec.frontend.maxUploadBytes) is the largest it takes.
MAX_UPLOAD = 4 * 1024**3

_VLLM = frozenset(
    {C.TRANSCRIPTIONS, C.TRANSLATIONS, C.STREAM, C.SEGMENT_TIMESTAMPS, C.LANGUAGE_DETECTION}
)

CAPABILITIES: dict[tuple[Engine, Mode], CapabilitySet] = {
    # vLLM transcribes in both modes; no word timestamps, no srt/vtt, `text` comes as JSON,
    # uploads over 25 MB are refused.
    (Engine.VLLM, Mode.CONTINUOUS): CapabilitySet(
        capabilities=_VLLM,
        max_upload_bytes=VLLM_MAX_UPLOAD,
        native_formats=frozenset({"json", "verbose_json"}),
    ),
    (Engine.VLLM, Mode.SEQUENTIAL): CapabilitySet(
        capabilities=_VLLM,
        max_upload_bytes=VLLM_MAX_UPLOAD,
        max_concurrency=1,
        native_formats=frozenset({"json", "verbose_json"}),
    ),
    # Our CPU worker: everything, one request at a time.
    (Engine.FASTER_WHISPER, Mode.SEQUENTIAL): CapabilitySet(
        capabilities=frozenset(Capability),
        max_upload_bytes=MAX_UPLOAD,
        max_concurrency=1,
        native_formats=frozenset({"json", "text", "srt", "vtt", "verbose_json"}),
    ),
    # `transformers serve` in continuous-batching mode refuses transcription ("requires
    # sequential generation (not CB)"): it serves chat only.
    (Engine.TRANSFORMERS, Mode.CONTINUOUS): CapabilitySet(
        capabilities=frozenset(),
        native_formats=frozenset(),
    ),
    # Sequential transformers transcribes, text only (no segments; verbose_json ignored).
    (Engine.TRANSFORMERS, Mode.SEQUENTIAL): CapabilitySet(
        capabilities=frozenset({C.TRANSCRIPTIONS, C.STREAM, C.LANGUAGE_DETECTION}),
        max_concurrency=1,
        native_formats=frozenset({"json"}),
        stream_dialect="raw-text",
    ),
}


def capability_set(engine: Engine, mode: Mode) -> CapabilitySet | None:
    """The capability set of a pair, or None when the engine cannot run in that mode."""
    return CAPABILITIES.get((engine, mode))


def supported_modes(engine: Engine) -> list[Mode]:
    return [m for (e, m) in CAPABILITIES if e == engine]


# Engines the automatic split may add, in order of preference, after the pool's own engine.
SPLIT_FALLBACK_ENGINES = (Engine.FASTER_WHISPER,)


# --------------------------------------------------------------------------- needs

ENDPOINTS = (Capability.TRANSCRIPTIONS, Capability.TRANSLATIONS)
SEGMENT_FORMATS = (ResponseFormat.SRT, ResponseFormat.VTT, ResponseFormat.VERBOSE_JSON)


def request_needs(
    endpoint: Capability,
    *,
    stream: bool = False,
    response_format: ResponseFormat = ResponseFormat.JSON,
    granularities: Iterable[Granularity] = (),
) -> frozenset[Capability]:
    """What a (valid) request needs from the pool that serves it."""
    needs = {endpoint}
    if stream:
        needs.add(Capability.STREAM)
    if response_format in SEGMENT_FORMATS:
        needs.add(Capability.SEGMENT_TIMESTAMPS)
    if Granularity.WORD in granularities:
        needs.add(Capability.WORD_TIMESTAMPS)
    return frozenset(needs)


def traffic_needs(endpoints: Iterable[str], features: Iterable[str]) -> list[frozenset[Capability]]:
    """Kinds of request declared traffic sends: each endpoint, alone and with each feature."""
    feats = list(features)
    needs: list[frozenset[Capability]] = []
    for endpoint in endpoints:
        needs.append(frozenset({Capability(endpoint)}))
        needs.extend(frozenset({Capability(endpoint), Capability(f)}) for f in feats)
    return needs


def covered(pools: Iterable[CapabilitySet], needs: frozenset[Capability]) -> bool:
    """Whether some pool serves a request with these needs."""
    return any(p.covers(needs) for p in pools)
