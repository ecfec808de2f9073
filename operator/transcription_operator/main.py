"""`transcription-operator`: run the operator.

transcription-operator                       watch all namespaces
transcription-operator -n speech -n asr      watch these namespaces only
transcription-operator -n 'team-*' -n '!team-ci-*'
                                             watch the namespaces these patterns admit
WATCH_NAMESPACES=speech,asr transcription-operator
transcription-operator --leader-elect         one of several replicas: only the Lease's holder
                                             reconciles (POD_NAME, POD_NAMESPACE from the pod)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import kopf
from prometheus_client import start_http_server

from . import (
    handlers,  # importing it registers the kopf handlers
    manager,
)
from .config import OperatorConfig
from .leader import (
    LEASE_DURATION,
    RENEW_DEADLINE,
    RETRY_PERIOD,
    ElectionConfig,
    ElectionConfigError,
    default_identity,
    default_namespace,
    parse_duration,
)
from .scope import Scope

LEASE_NAME = "transcription-operator"


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean: use true or false")


def duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_duration(text: str) -> float:
    seconds = duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration: use e.g. 5m")
    return seconds


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="transcription-operator", description=__doc__)
    p.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="namespace to watch, or a pattern ('team-*'; '!ci-*' leaves those out); "
        "repeatable; default: WATCH_NAMESPACES, else all",
    )
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="kubeconfig path")
    p.add_argument("--metrics-port", type=int, default=8080, help="Prometheus metrics port")
    p.add_argument("--health-port", type=int, default=8081, help="liveness endpoint port")
    p.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    env = os.environ.get
    p.add_argument(
        "--resync-period", type=positive_duration, metavar="DURATION",
        default=env("RESYNC_PERIOD", f"{manager.RESYNC_SECONDS:g}s"),
        help="how often every resource is reconciled again from the cache, with no request "
        "when nothing drifted (RESYNC_PERIOD; default 300s)",
    )  # fmt: skip
    le = p.add_argument_group(
        "leader election", "a coordination.k8s.io/v1 Lease; each flag's default is its env var"
    )
    le.add_argument(
        "--leader-elect", type=parse_bool, nargs="?", const=True, metavar="BOOL",
        default=env("LEADER_ELECT", "false"),
        help="run as one of several replicas: only the Lease's holder reconciles "
        "(LEADER_ELECT; default false)",
    )  # fmt: skip
    le.add_argument(
        "--leader-elect-lease-duration", type=duration, metavar="DURATION",
        default=env("LEADER_ELECT_LEASE_DURATION", f"{LEASE_DURATION:g}s"),
        help="how long standbys wait after the Lease's last change before taking over "
        "(LEADER_ELECT_LEASE_DURATION; default 15s)",
    )  # fmt: skip
    le.add_argument(
        "--leader-elect-renew-deadline", type=duration, metavar="DURATION",
        default=env("LEADER_ELECT_RENEW_DEADLINE", f"{RENEW_DEADLINE:g}s"),
        help="the leader stops reconciling when it could not renew for this long "
        "(LEADER_ELECT_RENEW_DEADLINE; default 10s)",
    )  # fmt: skip
    le.add_argument(
        "--leader-elect-retry-period", type=duration, metavar="DURATION",
        default=env("LEADER_ELECT_RETRY_PERIOD", f"{RETRY_PERIOD:g}s"),
        help="between renewals and acquire attempts (LEADER_ELECT_RETRY_PERIOD; default 2s)",
    )  # fmt: skip
    le.add_argument(
        "--leader-elect-resource-name", metavar="NAME",
        default=env("LEADER_ELECT_RESOURCE_NAME", LEASE_NAME),
        help=f"the Lease's name (LEADER_ELECT_RESOURCE_NAME; default {LEASE_NAME})",
    )  # fmt: skip
    le.add_argument(
        "--leader-elect-resource-namespace", metavar="NAMESPACE",
        default=env("LEADER_ELECT_RESOURCE_NAMESPACE") or default_namespace(),
        help="the Lease's namespace (LEADER_ELECT_RESOURCE_NAMESPACE; default: the pod's, "
        "POD_NAMESPACE)",
    )  # fmt: skip
    args = p.parse_args(argv)
    try:
        args.scope = Scope.of(args.namespace or list(OperatorConfig.from_env().namespaces))
    except ValueError as e:
        p.error(f"{e} (--namespace or WATCH_NAMESPACES)")
    args.election = None
    if args.leader_elect:
        if not args.leader_elect_resource_namespace:
            p.error(
                "--leader-elect: not running in a pod, so the Lease's namespace is unknown; "
                "set --leader-elect-resource-namespace (or POD_NAMESPACE)"
            )
        try:
            args.election = ElectionConfig(
                namespace=args.leader_elect_resource_namespace,
                name=args.leader_elect_resource_name,
                identity=default_identity(),
                lease_duration=args.leader_elect_lease_duration,
                renew_deadline=args.leader_elect_renew_deadline,
                retry_period=args.leader_elect_retry_period,
            )
        except ElectionConfigError as e:
            p.error(str(e))
    return args


def configure_logging(level: str) -> None:
    """The operator's log at `level`. kopf logs every watch event's handler at INFO
    ("Handler 'watch-pods' succeeded.": thousands of lines a minute for a few hundred
    resources): its per-object logger says only warnings and errors, unless at DEBUG."""
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if logging.getLevelName(level.upper()) != logging.DEBUG:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(args.log_level)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    manager.RUNTIME.kubeconfig = args.kubeconfig
    scope: Scope = args.scope
    manager.RUNTIME.scope = scope
    manager.RUNTIME.resync_seconds = args.resync_period
    if scope.cluster_wide:
        handlers.watch_namespaces()
    manager.RUNTIME.election_config = args.election
    start_http_server(args.metrics_port)
    logging.getLogger(__name__).info(
        "watching %s; metrics on :%d, liveness on :%d/healthz",
        scope,
        args.metrics_port,
        args.health_port,
    )
    asyncio.run(
        kopf.operator(
            # A pattern: one cluster-wide watch per kind, filtered here (`manager`), rather
            # than kopf's one watch per kind and matching namespace.
            clusterwide=scope.cluster_wide,
            namespaces=[] if scope.cluster_wide else list(scope.specs),
            standalone=True,
            liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz",
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
