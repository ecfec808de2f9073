"""`POST /v1/audio/diarization` on a worker with a speaker model (`SPEAKER_MODEL`): who
speaks when in the uploaded file, as `transcription_api.diarization.SpeakerTurns`, with
`known_speaker_names[]` and `known_speaker_references[]` (data URLs of 2-10 s of each
voice) naming the speakers that match. The gateway joins the turns to any engine's
transcript for `response_format=diarized_json`.

One file at a time per worker (`MAX_AT_ONCE`): the stage keeps the CPUs it is given busy.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Sequence
from contextlib import closing

from starlette.requests import Request
from starlette.responses import Response

from transcription_api.diarization import (
    NAMES,
    REFERENCES,
    SpeakerTurn,
    SpeakerTurns,
    check_reference_length,
    known_speakers,
)
from transcription_api.errors import APIError, bad_request
from transcription_api.multipart import check_length, parse_upload

from ..transcriber import AudioError, decode
from ..windows import SAMPLE_RATE
from . import known
from .pipeline import Diarizer

MAX_AT_ONCE = 1


def _values(fields: Sequence[tuple[str, str]], name: str) -> list[str]:
    return [v for k, v in fields if k in (name, name.removesuffix("[]"))]


class SpeakerService:
    """The endpoint, its model loaded once."""

    def __init__(self, diarizer: Diarizer, max_upload_bytes: int) -> None:
        self.diarizer = diarizer
        self.max_upload_bytes = max_upload_bytes
        self.slots = asyncio.Semaphore(MAX_AT_ONCE)

    async def endpoint(self, request: Request) -> Response:
        try:
            return await self._answer(request)
        except APIError as e:
            return Response(e.body(), e.status, e.headers, media_type="application/json")

    async def _answer(self, request: Request) -> Response:
        limit = self.max_upload_bytes
        check_length(request.headers.get("content-length"), limit)
        upload = await parse_upload(request.stream(), request.headers.get("content-type"), limit)
        with closing(upload):
            speakers = known_speakers(
                _values(upload.fields, NAMES), _values(upload.fields, REFERENCES)
            )
            if upload.file is None:
                raise bad_request("the `file` part is missing", "file")
            try:
                audio = await asyncio.to_thread(decode, upload.file)
            except AudioError as e:
                raise bad_request(str(e), "file", code="invalid_audio") from e
        clips = []
        for i, k in enumerate(speakers):
            try:
                clip = await asyncio.to_thread(decode, io.BytesIO(k.audio))
            except AudioError as e:
                raise bad_request(f"known_speaker_references[{i}]: {e}", REFERENCES) from e
            check_reference_length(clip.shape[0] / SAMPLE_RATE, i)
            clips.append(clip)
        try:
            references = known.references([k.name for k in speakers], clips)
        except known.SpeakerInputError as e:
            raise bad_request(str(e), e.param) from e
        async with self.slots:
            result = await asyncio.to_thread(self.diarizer.diarize, audio, references)
        answer = SpeakerTurns(
            duration=round(audio.shape[0] / SAMPLE_RATE, 3),
            speakers=result.speakers,
            turns=[SpeakerTurn(start=t.start, end=t.end, speaker=t.speaker) for t in result.turns],
        )
        return Response(answer.model_dump_json(), media_type="application/json")
