"""`transcription-operator`: run the operator.

transcription-operator                       watch all namespaces
transcription-operator -n speech -n asr      watch these namespaces only
WATCH_NAMESPACES=speech,asr transcription-operator
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import kopf
from prometheus_client import start_http_server

from . import handlers
from .config import OperatorConfig


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="transcription-operator", description=__doc__)
    p.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="namespace to watch (repeatable); default: WATCH_NAMESPACES, else all",
    )
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="kubeconfig path")
    p.add_argument("--metrics-port", type=int, default=8080, help="Prometheus metrics port")
    p.add_argument("--health-port", type=int, default=8081, help="liveness endpoint port")
    p.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    handlers.RUNTIME.kubeconfig = args.kubeconfig
    namespaces: list[str] = args.namespace or list(OperatorConfig.from_env().namespaces)
    handlers.RUNTIME.namespaces = tuple(namespaces)
    start_http_server(args.metrics_port)
    logging.getLogger(__name__).info(
        "watching %s; metrics on :%d, liveness on :%d/healthz",
        ", ".join(namespaces) if namespaces else "all namespaces",
        args.metrics_port,
        args.health_port,
    )
    asyncio.run(
        kopf.operator(
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=True,
            liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz",
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
