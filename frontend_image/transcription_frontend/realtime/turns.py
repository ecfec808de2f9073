"""One committed turn, transcribed through the gateway's own pipeline (subrequest.py).

A turn is the request an HTTP client would send: a WAV file with the session's model,
language, prompt, languages, keywords and logprobs, streamed (`stream=true`) where a pool
streams, so that deltas flow while the turn decodes; else whole (transformers pools), as
one delta.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from transcription_api.capabilities import Capability
from transcription_api.openai import Language, Logprob
from transcription_api.realtime import LOGPROBS, ErrorBody, TranscriptionSession
from transcription_api.routes import RouteTable

from ..gateway import Gateway
from ..pipeline import transcribe
from ..routing import NoPool
from ..subrequest import TURN, Caller, post


@dataclass
class Answer:
    text: str = ""
    seconds: float | None = None
    logprobs: list[Logprob] | None = None
    languages: list[Language] | None = None


class TurnFailed(Exception):
    def __init__(self, error: ErrorBody, status: int) -> None:
        super().__init__(error.message)
        self.error = error
        self.status = status


def fields(session: TranscriptionSession, stream: bool) -> list[tuple[str, str]]:
    """The form fields of a turn's transcription request."""
    t = session.input.transcription
    out = [("response_format", "json"), ("stream", str(stream).lower())]
    if t.model is not None:
        out.append(("model", t.model))
    if t.language is not None:
        out.append(("language", t.language))
    if t.prompt:
        out.append(("prompt", t.prompt))
    out += [("languages[]", code) for code in t.languages or []]
    out += [("keywords[]", word) for word in t.keywords or []]
    if LOGPROBS in (session.include or []):
        out.append(("include[]", "logprobs"))
    return out


def _answer(payload: dict[str, Any]) -> Answer:
    usage = payload.get("usage") or {}
    return Answer(
        text=payload.get("text", ""),
        seconds=usage.get("seconds") if usage.get("type") == "duration" else None,
        logprobs=[Logprob.model_validate(x) for x in payload.get("logprobs") or []] or None,
        languages=[Language.model_validate(x) for x in payload.get("languages") or []] or None,
    )


def _error(body: bytes) -> ErrorBody:
    try:
        return ErrorBody.model_validate(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return ErrorBody(message=body.decode("utf-8", "replace")[:500] or "no answer",
                         type="server_error")  # fmt: skip


async def transcribe_turn(
    gw: Gateway, table: RouteTable | None, wav: bytes, session: TranscriptionSession,
    caller: Caller, on_delta: Callable[[str, list[Logprob] | None], Awaitable[None]],
) -> Answer:  # fmt: skip
    """Transcribe one turn by the session's deployment (`table`: None while its model names
    none, and the pipeline says so); TurnFailed with the error the pipeline answered (after
    its retries and holds). Cancelling it cancels the worker's request."""
    needs = frozenset({Capability.TRANSCRIPTIONS, Capability.STREAM})
    streams = table is not None and not isinstance(
        gw.router.candidates(table, needs, len(wav)), NoPool
    )
    done: list[Answer] = []
    failed: list[ErrorBody] = []

    async def on_event(payload: dict[str, Any]) -> None:
        kind = payload.get("type")
        if kind == "transcript.text.delta":
            lps = [Logprob.model_validate(x) for x in payload.get("logprobs") or []] or None
            await on_delta(payload.get("delta", ""), lps)
        elif kind == "transcript.text.done":
            done.append(_answer(payload))
        elif kind == "error":
            failed.append(ErrorBody.model_validate(payload.get("error") or {"message": "error"}))

    status, body = await post(transcribe, gw, Capability.TRANSCRIPTIONS, fields(session, streams),
                              wav, "turn.wav", "audio/wav", caller, TURN, on_event)  # fmt: skip
    if status != 200:
        raise TurnFailed(_error(body), status)
    if body:  # a whole answer (no pool streams): one delta, then done
        answer = _answer(json.loads(body))
        await on_delta(answer.text, None)
        return answer
    if failed:
        raise TurnFailed(failed[0], status)
    if not done:
        raise TurnFailed(ErrorBody(message="the transcription ended without its last event",
                                   type="server_error"), status)  # fmt: skip
    return done[0]
