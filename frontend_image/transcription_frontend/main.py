"""`transcription-frontend`: run the gateway.

transcription-frontend --routes routes.json                      static endpoints
transcription-frontend --routes /etc/transcription/routes.json --discovery kubernetes \
    --peers-service whisper

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
from pathlib import Path
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .app import Gateway, create_app
from .discovery import load_table
from .forward import WorkerTimeouts
from .hold import HoldLimits
from .limits import guarded_protocol, limits_args, limits_of
from .longaudio.settings import chunking_args, chunking_of
from .routing import Router
from .tracing import TracingSettings, setup


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="transcription-frontend", description=__doc__)
    p.add_argument("--routes", type=Path, required=True, help="route table (JSON) path")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument(
        "--discovery",
        choices=["static", "kubernetes"],
        default="static",
        help="worker endpoints from the route table (static) or from EndpointSlices",
    )
    p.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="namespace of the pool Services (default: the route table's)",
    )
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    p.add_argument(
        "--balancer",
        choices=["least-in-flight", "round-robin"],
        default="least-in-flight",
        help="endpoint choice within a pool",
    )
    p.add_argument("--api-keys", type=Path, help="file with accepted API keys, one per line")
    p.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "info"))
    scale = p.add_argument_group("autoscaling and scale from zero")
    scale.add_argument(
        "--scaler-port",
        type=int,
        default=9090,
        help="port of KEDA's external scaler (gRPC externalscaler.ExternalScaler); 0: off",
    )
    scale.add_argument(
        "--internal-port",
        type=int,
        default=9091,
        help="port of /internal/load (each replica's load, for its peers), off the public "
        "port; 0: served on the public port (one process, development)",
    )
    scale.add_argument(
        "--peers-service",
        help="the frontend's own Service: its other endpoints' load is summed into the "
        "scaler's metric (with --discovery kubernetes; else this replica's load is the total)",
    )
    d = HoldLimits()
    scale.add_argument(
        "--hold-max-requests",
        type=positive_int,
        default=d.max_requests,
        help="requests held per pool while it has no ready worker; more get 503",
    )
    scale.add_argument(
        "--hold-max-bytes",
        type=positive_int,
        default=d.max_bytes,
        help="bytes of held uploads (spooled to disk), all pools together; more get 503",
    )
    scale.add_argument(
        "--hold-max-memory-bytes",
        type=positive_int,
        default=d.max_memory_bytes,
        help="bytes of held chat bodies (in memory), all pools together; more get 503",
    )
    scale.add_argument(
        "--hold-timeout",
        type=positive_float,
        default=d.timeout,
        help="seconds a request may be held before it gets 503",
    )
    t = WorkerTimeouts()
    faults = p.add_argument_group("faults and shutdown")
    faults.add_argument(
        "--worker-connect-timeout",
        type=positive_float,
        default=t.connect,
        help="seconds to connect to a worker before trying another",
    )
    faults.add_argument(
        "--worker-read-timeout",
        type=positive_float,
        default=t.read,
        help="seconds a worker may send nothing (before or during its answer): then 504",
    )
    faults.add_argument(
        "--shutdown-grace",
        type=positive_int,
        default=30,
        help="on SIGTERM: seconds for requests in flight and held to finish, after up to 5 s in "
        "which kept-alive connections end after an answer (keep both below the pod's "
        "terminationGracePeriodSeconds minus its preStop delay)",
    )
    limits_args(p)
    chunking_args(p)
    return p.parse_args(argv)


# After SIGTERM, how long kept-alive connections have to bring one more request, answered
# with `Connection: close`, before the rest are closed (part of --shutdown-grace).
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        table = load_table(args.routes)
    except (OSError, ValueError) as e:
        print(f"error: cannot read the route table {args.routes}: {e}", file=sys.stderr)
        return 2
    limits = limits_of(args)
    gateway = Gateway(
        router=Router(table, policy=args.balancer),
        api_keys_path=args.api_keys,
        table_path=args.routes,
        slice_namespace=(args.namespace or table.namespace)
        if args.discovery == "kubernetes"
        else None,
        kubeconfig=args.kubeconfig,
        hold_limits=HoldLimits(
            args.hold_max_requests,
            args.hold_max_bytes,
            args.hold_timeout,
            max_memory_bytes=args.hold_max_memory_bytes,
        ),
        worker_timeouts=WorkerTimeouts(args.worker_connect_timeout, args.worker_read_timeout),
        peers_service=args.peers_service,
        scaler_port=args.scaler_port or None,
        scaler_host=args.host,
        internal_port=args.internal_port or None,
        limits=limits,
        chunking=chunking_of(args),
        tracer=setup(TracingSettings.from_env(os.environ)),
    )
    drain = CloseWhenDraining(create_app(gateway))
    config = uvicorn.Config(
        drain,
        host=args.host,
        port=args.port,
        log_level=args.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=args.shutdown_grace,
        http=guarded_protocol(limits),
        timeout_keep_alive=limits.idle_timeout,
        limit_concurrency=limits.max_connections,
        # a WebSocket message: the largest append, base64-encoded, and its JSON around it
        ws_max_size=limits.max_append_bytes * 4 // 3 + 64 * 1024,
    )
    server = Server(config, gateway, drain)
    server.run()
    return 0 if server.started else 3  # 3: startup failed (uvicorn's code; logged above)


if __name__ == "__main__":
    sys.exit(main())
