"""The endpoints served ahead of FastAPI in the OpenAPI document: the audio endpoints, their
form derived from the request model, and chat completions, from its JSON model."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from transcription_api.chat import ChatCompletionRequest
from transcription_api.openai import TranscriptionRequest

AUDIO_ROUTES = {
    "/v1/audio/transcriptions": "Transcribe audio",
    "/v1/audio/translations": "Translate audio to English",
}
RESPONSES = {
    "200": {"description": "The transcript, in the requested format."},
    "400": {"description": "Bad input (`invalid_request_error`)."},
    "401": {"description": "Missing or wrong API key."},
    "404": {"description": "Unknown model."},
    "413": {"description": "Upload over the limit."},
    "502": {"description": "A worker failed."},
    "503": {"description": "No ready worker."},
}
CHAT_RESPONSES = {
    **RESPONSES,
    "200": {"description": "The completion (JSON), or server-sent chunks with `stream`."},
    "413": {"description": "JSON body over the upload limit."},
}


def form_schema() -> dict[str, Any]:
    """`multipart/form-data` schema: `file`, then every field of TranscriptionRequest."""
    model = TranscriptionRequest.model_json_schema(by_alias=True)
    defs = model.get("$defs", {})
    props: dict[str, Any] = {
        "file": {"type": "string", "format": "binary", "description": "The audio file."}
    }
    for name, prop in model["properties"].items():
        props[name] = _inline(prop, defs)
    return {"type": "object", "required": ["file"], "properties": props}


def _inline(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Resolve `$ref`s and drop `null` alternatives (a form field is sent or left out)."""
    if "$ref" in schema:
        ref = dict(defs[schema["$ref"].rsplit("/", 1)[1]])
        ref.pop("title", None)
        return {**ref, **{k: v for k, v in schema.items() if k != "$ref"}}
    if "anyOf" in schema:
        options = [o for o in schema["anyOf"] if o.get("type") != "null"]
        rest = {k: v for k, v in schema.items() if k not in ("anyOf", "default", "title")}
        if len(options) == 1:
            return {**_inline(options[0], defs), **rest}
    out = {k: v for k, v in schema.items() if k != "title"}
    if "items" in out:
        out["items"] = _inline(out["items"], defs)
    return out


def document_audio_routes(app: FastAPI) -> None:
    """Add the audio endpoints (served ahead of FastAPI) to the app's OpenAPI document."""
    base = app.openapi
    body = {"required": True, "content": {"multipart/form-data": {"schema": form_schema()}}}

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = base()
            for path, summary in AUDIO_ROUTES.items():
                operation = {"summary": summary, "requestBody": body, "responses": RESPONSES}
                schema.setdefault("paths", {})[path] = {"post": operation}
            chat = ChatCompletionRequest.model_json_schema(
                ref_template="#/components/schemas/{model}"
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(chat.pop("$defs", {}))
            components["ChatCompletionRequest"] = chat
            ref = {"$ref": "#/components/schemas/ChatCompletionRequest"}
            schema["paths"]["/v1/chat/completions"] = {"post": {
                "summary": "Chat with an audio language model (audio input inline, base64)",
                "requestBody": {"required": True, "content": {"application/json": {"schema": ref}}},
                "responses": CHAT_RESPONSES,
            }}  # fmt: skip
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
