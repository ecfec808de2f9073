"""The OpenAI-compatible gateway as an ASGI app.

The two audio endpoints run the request pipeline (`pipeline.py`), and chat completions its
twin (`chat.py`), ahead of FastAPI's stack: they parse their own bodies and answer every
error themselves, so FastAPI's routing, dependency, exception and body-limit layers would
add nothing for them but about 0.4 ms of CPU per request, a fifth of the gateway's budget.
Everything else is plain FastAPI.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send

from transcription_api import realtime as rt
from transcription_api.capabilities import Capability
from transcription_api.errors import APIError
from transcription_api.openai import ModelCard, ModelList

from . import chat, errors, load
from .auth import authorization, may_use
from .gateway import Gateway
from .limits import Guard
from .openapi import document_audio_routes
from .pipeline import transcribe
from .realtime import endpoint as realtime
from .request_id import RequestIdMiddleware
from .respond import Reply

__all__ = ["Gateway", "create_app"]

BODY_OVERHEAD = 1024 * 1024  # the whole body's cap: the upload limit and this, by default
OWNER = "transcription-operator"  # /v1/models' owned_by in a deployment's own frontend
AUDIO_PATHS = {
    "/v1/audio/transcriptions": Capability.TRANSCRIPTIONS,
    "/v1/audio/translations": Capability.TRANSLATIONS,
}


def create_app(gateway: Gateway) -> ASGIApp:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with gateway.running():
            yield

    app = FastAPI(
        title="transcription gateway",
        version="0.1.0",
        description="OpenAI-compatible speech-to-text API in front of the worker pools.",
        lifespan=lifespan,
        # Swagger UI and ReDoc load their assets from a CDN: off unless the settings ask.
        docs_url="/docs" if gateway.settings.api_docs else None,
        redoc_url="/redoc" if gateway.settings.api_docs else None,
    )
    app.state.gateway = gateway
    errors.install(app)
    document_audio_routes(app)

    @app.get("/v1/models")
    async def models(request: Request) -> ModelList:
        """Every name of every deployment routed here that the key (and its tenant) may use,
        owned by its deployment (`<namespace>/<name>`; a deployment's own frontend: the
        operator)."""
        caller = gateway.caller(authorization(request.scope["headers"]))
        catalog = gateway.router.catalog
        return ModelList(
            data=[
                ModelCard(id=n, created=gateway.started, owned_by=t.deployment or OWNER,
                          root=t.model, parent=None if n == t.model else t.model)
                for t in catalog.tables if may_use(caller, t.model, catalog.primary_of)
                for n in t.served_names
            ]
        )  # fmt: skip

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", response_model=None)
    async def ready() -> dict[str, str] | Response:
        # Ready with every pool at zero too: the gateway accepts requests and holds them
        # while their pool scales up (hold.py). Not ready while a configured key file has
        # no key (auth.py): the gateway fails closed, never open.
        gateway.keys.keys()
        if gateway.keys.problem is not None:
            reason = key_file_problem(gateway.keys.problem)
            return JSONResponse({"status": "not ready", "reason": reason}, status_code=503)
        return {"status": "ready"}

    if gateway.settings.internal_port is None:  # else on its own port, off this one (load.py)

        @app.get(load.PATH, include_in_schema=False)
        async def internal_load() -> load.LoadReport:
            """This replica's load by pool, for its peers (load.py)."""
            return gateway.load.local()

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    def body_cap() -> int:
        return gateway.router.catalog.max_upload_bytes + BODY_OVERHEAD

    return RequestIdMiddleware(Guard(Pipelines(app, gateway), gateway.settings.limits, body_cap))


def key_file_problem(problem: str) -> str:
    """What is wrong with the key file, for whoever asks `/ready` (no key is needed): not its
    path nor the system's error, which the log and the pod's Warning Event tell."""
    return "the API key file " + ("has no key" if problem.endswith("has no key") else
                                  "cannot be read")  # fmt: skip


class Pipelines:
    """`POST /v1/audio/*` and `POST /v1/chat/completions` -> their pipelines; any other
    request -> FastAPI."""

    def __init__(self, app: FastAPI, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self.websocket(scope, receive, send)
            return
        path = scope.get("path", "") if scope["type"] == "http" else ""
        endpoint = AUDIO_PATHS.get(path)
        if endpoint is None and path != chat.PATH:
            await self.app(scope, receive, send)
        elif scope["method"] != "POST":
            error = APIError(405, f"{scope['method']} is not allowed; use POST")
            await Reply.error(error).send(send)
        elif endpoint is None:
            await chat.complete(self.gateway, scope, receive, send)
        else:
            await transcribe(self.gateway, endpoint, scope, receive, send)

    async def websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("path") == rt.PATH:
            await realtime.serve(self.gateway, self.gateway.sessions, scope, receive, send)
        else:
            error = APIError(404, f"No WebSocket at {scope.get('path')}; realtime "
                             f"transcription is at {rt.PATH}?intent=transcription.",
                             code="unknown_url")  # fmt: skip
            await realtime.refuse(scope, send, error)
