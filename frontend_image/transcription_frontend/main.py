"""`transcription-frontend`: run the gateway.

transcription-frontend --routes routes.json                      static endpoints
transcription-frontend --routes /etc/transcription/routes.json --discovery kubernetes
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import uvicorn

from .app import Gateway, create_app
from .discovery import load_table
from .routing import Router


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
    return p.parse_args(argv)


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
    gateway = Gateway(
        router=Router(table, policy=args.balancer),
        api_keys_path=args.api_keys,
        table_path=args.routes,
        slice_namespace=(args.namespace or table.namespace)
        if args.discovery == "kubernetes"
        else None,
        kubeconfig=args.kubeconfig,
    )
    uvicorn.run(
        create_app(gateway),
        host=args.host,
        port=args.port,
        log_level=args.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=30,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
