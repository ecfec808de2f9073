"""`response_format=diarized_json`: who said what, on every engine.

A diarized request becomes two requests into the gateway's own pipeline (`subrequest.PART`),
sent at once:

- its transcript: the client's fields, as `verbose_json`, to the pool any timed transcript
  goes to (a continuous vLLM pool before a faster-whisper one), with word times where that
  pool gives them (segments otherwise), long audio cut into chunks as for any request
  (`chunking_strategy`);
- its speakers: `POST /v1/audio/diarization` to a pool whose workers run the speaker stage
  (capability diarization), with the known speakers; one clustering over the whole file, so
  labels are the same however the transcript was cut.

Then each word (or segment) gets the speaker whose turns cover most of it
(`transcription_api.diarization.diarize`). A stream sends each labelled segment as a
`transcript.text.segment` event, then `transcript.text.done`. The request was charged
once, whole; its parts are not.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import TypeVar

from pydantic import ValidationError
from starlette.types import Scope

from transcription_api import sse
from transcription_api.capabilities import Capability
from transcription_api.diarization import NAMES, REFERENCES, SpeakerTurns, diarize
from transcription_api.errors import APIError, bad_request
from transcription_api.multipart import Upload
from transcription_api.openai import (
    DurationUsage,
    Granularity,
    TextDone,
    TranscriptionRequest,
    VerboseTranscription,
)
from transcription_api.render import JSON, billed_seconds
from transcription_api.routes import RouteTable

from .gateway import Gateway
from .request_id import request_id
from .respond import Reply
from .routing import NoPool
from .subrequest import PART, Caller, Pipeline, post

# The client's fields that belong to the diarized answer, not to its transcript.
NOT_FOR_THE_TRANSCRIPT = {
    "response_format", "stream", "stream_include_usage", "timestamp_granularities[]",
    "timestamp_granularities", NAMES, NAMES.removesuffix("[]"), REFERENCES,
    REFERENCES.removesuffix("[]"),
}  # fmt: skip
SPEAKER_FIELDS = {NAMES, NAMES.removesuffix("[]"), REFERENCES, REFERENCES.removesuffix("[]")}


def check(gw: Gateway, endpoint: Capability, table: RouteTable, size: int) -> None:
    """400 before any part is sent: a translation (OpenAI diarizes transcriptions only), or
    a deployment without a pool that runs the speaker stage."""
    if endpoint != Capability.TRANSCRIPTIONS:
        raise bad_request(
            "response_format=diarized_json is for transcriptions, not translations",
            "response_format",
        )
    if isinstance(gw.router.candidates(table, frozenset({Capability.DIARIZATION}), size), NoPool):
        which = f"deployment {table.deployment}" if table.deployment else "this deployment"
        raise bad_request(
            f"no pool of {which} can serve this request: missing capability diarization "
            "(response_format=diarized_json needs a pool that runs the speaker stage)",
            code="unsupported_capability",
        )


async def transcribe_diarized(
    pipeline: Pipeline, gw: Gateway, scope: Scope, upload: Upload,
    request: TranscriptionRequest, table: RouteTable, known_seconds: float | None,
) -> Reply:  # fmt: skip
    """The diarized answer (or stream) of a transcription request to `table`'s deployment."""
    assert upload.file is not None
    headers = dict(scope["headers"])
    caller = Caller(headers.get(b"authorization"), scope.get("client"), request_id(scope))
    words = _words(gw, table, upload.size)
    model = [("model", table.model)] if not any(k == "model" for k, _ in upload.fields) else []
    asr_fields = [
        *model,
        *((k, v) for k, v in upload.fields if k not in NOT_FOR_THE_TRANSCRIPT),
        ("response_format", "verbose_json"),
        ("timestamp_granularities[]", Granularity.SEGMENT.value),
        *([("timestamp_granularities[]", Granularity.WORD.value)] if words else []),
    ]
    speaker_fields = [
        *model,
        *((k, v) for k, v in upload.fields if k == "model" or k in SPEAKER_FIELDS),
        ("response_format", "diarized_json"),
    ]
    name, ctype = upload.filename, upload.file_content_type
    with gw.tracer.span("diarized", {"transcription.diarized.words": words}):
        (asr_status, asr_body), (spk_status, spk_body) = await asyncio.gather(
            post(pipeline, gw, Capability.TRANSCRIPTIONS, asr_fields, upload.file, name, ctype,
                 caller, PART),
            post(pipeline, gw, Capability.DIARIZATION, speaker_fields, upload.file, name, ctype,
                 caller, PART),
        )  # fmt: skip
    transcript = _read(asr_status, asr_body, VerboseTranscription, "transcript")
    speakers = _read(spk_status, spk_body, SpeakerTurns, "speakers")
    seconds = billed_seconds({"duration": transcript.duration}, known_seconds)
    answer = diarize(transcript, speakers.as_turns(), seconds)
    if not request.stream:
        return Reply(200, JSON, answer.model_dump_json(exclude_none=True).encode(),
                     seconds=seconds)  # fmt: skip

    async def events() -> AsyncIterator[bytes]:
        for segment in answer.segments:
            yield sse.encode(segment)
        usage = DurationUsage(seconds=seconds) if seconds is not None else None
        yield sse.encode(TextDone(text=answer.text, usage=usage))

    return Reply(200, sse.MEDIA_TYPE, stream=events(), headers=dict(sse.HEADERS), seconds=seconds)


def _words(gw: Gateway, table: RouteTable, size: int) -> bool:
    """Whether to ask the transcript for word times: where the pool it goes to first (the
    one any timed transcript goes to) gives them. A vLLM pool beside a small faster-whisper
    pool that runs the speaker stage keeps the transcripts, in segments; the small pool
    only diarizes."""
    timed = frozenset({Capability.TRANSCRIPTIONS, Capability.SEGMENT_TIMESTAMPS})
    pools = gw.router.candidates(table, timed, size)
    return not isinstance(pools, NoPool) and pools[0].capability_set.covers(
        frozenset({Capability.WORD_TIMESTAMPS})
    )


Part = TypeVar("Part", VerboseTranscription, SpeakerTurns)


def _read(status: int, body: bytes, model: type[Part], what: str) -> Part:
    """A part's answer, or its error as the client's (a part's 4xx is the request's)."""
    if status == 200:
        try:
            return model.model_validate_json(body)
        except ValidationError as e:
            message = f"the {what} of a diarized request came back unreadable: {e}"
            raise APIError(502, message) from e
    try:
        error = json.loads(body)["error"]
        raise APIError(status, str(error["message"]), param=error.get("param"),
                       code=error.get("code"), type=error.get("type"))  # fmt: skip
    except (ValueError, KeyError, TypeError):
        raise APIError(status, f"the {what} of a diarized request failed ({status})") from None
