"""`transcription-frontend`: run the gateway.

    transcription-frontend --routes routes.json                      static endpoints
    transcription-frontend --routes routes.json --settings frontend.json

The route table is one deployment's (a RouteTable) or a gateway's (Routes: the tables of
every deployment it routes to); both in transcription_api.routes.

Everything but the route table comes from the frontend's settings (FrontendSettings, in
transcription_api.frontend): the JSON in --settings FILE, else in the
TRANSCRIPTION_FRONTEND_SETTINGS environment variable (the operator writes it into the
pod), else every default (port 8080, endpoints from the route table, ...). E.g.
{"port": 8081, "scaler_port": null, "limits": {"max_concurrency": 64}}.

Tracing is on when OpenTelemetry's OTEL_EXPORTER_OTLP_ENDPOINT (or _TRACES_ENDPOINT) is set,
exporting over OTLP/HTTP; OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and
OTEL_TRACES_SAMPLER_ARG (the ratio of new traces sampled) are read too (tracing.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from transcription_api.frontend import SETTINGS_ENV, Discovery, FrontendSettings, SettingsError
from transcription_api.routes import Routes, RouteTable

from .app import Gateway, create_app
from .connections import guarded_protocol
from .discovery import load_table
from .heap import hold_steady
from .routing import Router
from .tracing import TracingSettings, setup


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="transcription-frontend",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--routes", type=Path, required=True, help="route table (JSON) path")
    p.add_argument(
        "--settings",
        type=Path,
        help=f"frontend settings (JSON) path; default: ${SETTINGS_ENV}, else every default",
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="the cluster to discover endpoints in, from outside it (default: in-cluster)",
    )
    p.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "info"))
    return p.parse_args(argv)


def load_settings(path: Path | None, environ: Mapping[str, str]) -> FrontendSettings:
    """The settings of --settings FILE, else of the environment variable, else defaults."""
    return FrontendSettings.from_file(path) if path else FrontendSettings.from_env(environ)


# After SIGTERM, how long kept-alive connections have to bring one more request, answered
# with `Connection: close`, before the rest are closed (part of the shutdown grace).
KEEP_ALIVE_DRAIN = 5.0


class CloseWhenDraining:
    """ASGI: once `on`, every response says `Connection: close` (uvicorn then closes the
    connection after it), so that a client learns from an answer that a connection ends,
    never from a reset under its next request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.on = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def closing(message: Message) -> None:
            if self.on and message["type"] == "http.response.start":
                headers = [*message.get("headers", ()), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, closing)


class Server(uvicorn.Server):
    """uvicorn's server, with a graceful shutdown in two steps:
    1. stop accepting, and let each kept-alive connection end after one more answer
       (`KEEP_ALIVE_DRAIN` seconds at most; at once when none is idle): uvicorn alone
       closes idle connections at once, which races a client's next request;
    2. uvicorn's: requests in flight finish; the gateway answers what it holds a little
       before the grace period ends, so that the answer still reaches the client."""

    def __init__(self, config: uvicorn.Config, gateway: Gateway, drain: CloseWhenDraining) -> None:
        super().__init__(config)
        self.gateway = gateway
        self.closing = drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        grace = self.config.timeout_graceful_shutdown or 0
        self.gateway.drain(max(grace - 1.0, grace / 2))
        drain = min(KEEP_ALIVE_DRAIN, grace / 2)
        # Realtime sessions end their turns and close with 1001 (uvicorn alone: 1012 at once).
        await asyncio.gather(self.end_keep_alive(drain), self.gateway.sessions.drain(drain))
        await super().shutdown(sockets)

    async def end_keep_alive(self, seconds: float) -> None:
        self.closing.on = True
        for server in self.servers:
            server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        # uvicorn signals no event for this: polled, as its own shutdown does
        while loop.time() < deadline and any(_idle(c) for c in self.server_state.connections):  # noqa: ASYNC110
            await asyncio.sleep(0.05)


def _idle(connection: Any) -> bool:
    """An HTTP connection between two requests (uvicorn's own test, in its protocols'
    `shutdown`); a WebSocket is never idle in this sense."""
    if not hasattr(connection, "cycle"):
        return False
    cycle = connection.cycle
    return cycle is None or bool(cycle.response_complete)


def gateway_of(
    settings: FrontendSettings, table: RouteTable | Routes, table_path: Path,
    kubeconfig: str | None, environ: Mapping[str, str],
) -> Gateway:  # fmt: skip
    """The gateway these settings describe, on this route table."""
    own = table.namespace if isinstance(table, RouteTable) else "default"
    namespace = settings.namespace or environ.get("POD_NAMESPACE") or own
    return Gateway(
        router=Router(table, policy=settings.balancer.value),
        settings=settings,
        table_path=table_path,
        slice_namespace=namespace if settings.discovery == Discovery.KUBERNETES else None,
        kubeconfig=kubeconfig,
        tracer=setup(TracingSettings.from_env(environ)),
    )


def config_of(settings: FrontendSettings, app: ASGIApp, log_level: str) -> uvicorn.Config:
    """uvicorn's configuration: the address, the shutdown grace and the connection limits
    (the protocol's own: uvicorn's `limit_concurrency` answers in plain text)."""
    limits = settings.limits
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=settings.shutdown_grace_seconds,
        http=guarded_protocol(limits),
        timeout_keep_alive=limits.idle_timeout_seconds,
        # a WebSocket message: twice the largest append, base64-encoded, and its JSON around
        # it (an append up to twice the limit gets an error event; a larger one is not read)
        ws_max_size=limits.realtime_max_append_bytes * 8 // 3 + 64 * 1024,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not hold_steady():
        logging.getLogger(__name__).info("not glibc: its heap's mmap threshold left as it is")
    try:
        settings = load_settings(args.settings, os.environ)
    except SettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        table = load_table(args.routes)
    except (OSError, ValueError) as e:
        print(f"error: cannot read the route table {args.routes}: {e}", file=sys.stderr)
        return 2
    gateway = gateway_of(settings, table, args.routes, args.kubeconfig, os.environ)
    drain = CloseWhenDraining(create_app(gateway))
    config = config_of(settings, drain, args.log_level)
    server = Server(config, gateway, drain)
    server.run()
    return 0 if server.started else 3  # 3: startup failed (uvicorn's code; logged above)


if __name__ == "__main__":
    sys.exit(main())
