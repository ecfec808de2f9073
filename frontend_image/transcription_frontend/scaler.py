"""KEDA's external scaler, served by the frontend over gRPC (the settings' `scaler_port`, 9090).

A ScaledObject per pool points its `external-push` trigger at the frontend Service
(`scalerAddress: <service>.<namespace>:9090`), with this metadata:

    pool                    the pool's name, as in the route table
    targetQueueSeconds      seconds of work per replica the pool should run at (> 0;
                            default TARGET_QUEUE_SECONDS)
    audioSecondsPerReplica  audio seconds one replica decodes per second until measured
                            (> 0; default: the pool's engine's, by mode)

- GetMetricSpec: one metric, `pool-<pool>`, whose target is `targetQueueSeconds`.
- GetMetrics: its value, the pool's work in seconds of one replica's decoding: the audio
  arriving, queued and in flight for it (spilled included; its recent average when higher,
  so that the gaps between a batching pool's answers do not read as idleness), over its
  decode rate, on every frontend replica (`load.work_seconds`). KEDA's target is fixed
  when it reads the spec, so the measured rate divides the value: value / target = audio /
  (rate x target), the replicas that drain the pool's audio in `targetQueueSeconds`.
- IsActive: a request waits for the pool or is at its workers (or at a fallback's in its
  place), or a realtime session uses it (`load.total` > 0).
- StreamIsActive: the same, pushed: at once when a request starts being held here (so a
  pool at zero is woken without waiting for KEDA's polling interval), whenever it changes
  (looked at every `TICK_SECONDS`, peers included), and again every `RESEND_SECONDS`.

Metadata without a `pool` or with a bad number is INVALID_ARGUMENT; a pool the route
table does not name (yet), NOT_FOUND. Other keys (an earlier release's `target`) are
ignored. The messages are generated from
`externalscaler/externalscaler.proto`; the handlers are registered by the service's
method names, checked against the proto when the server starts.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Mapping
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import grpc

from transcription_api.frontend import TARGET_QUEUE_SECONDS

from .externalscaler import externalscaler_pb2 as pb
from .load import Load, total, work_seconds
from .routing import Router

log = logging.getLogger("transcription_frontend.scaler")
TICK_SECONDS = 1.0
RESEND_SECONDS = 10.0
SERVICE = pb.DESCRIPTOR.services_by_name["ExternalScaler"]
Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True)
class Trigger:
    """What one ScaledObject's trigger asks about."""

    pool: str
    target_queue_seconds: float = TARGET_QUEUE_SECONDS
    audio_seconds_per_replica: float | None = None  # None: the pool's engine's

    @property
    def metric(self) -> str:
        return f"pool-{self.pool}"


def parse_trigger(metadata: Mapping[str, str]) -> Trigger:
    """The trigger's metadata, checked; ValueError says what to fix."""
    pool = metadata.get("pool", "").strip()
    if not pool:
        raise ValueError("the trigger's metadata has no `pool`: set it to the pool's name")
    target = _positive(metadata, "targetQueueSeconds", "seconds of work per replica")
    rate = _positive(metadata, "audioSecondsPerReplica", "audio seconds a replica decodes a second")
    return Trigger(pool, target or TARGET_QUEUE_SECONDS, rate)


def _positive(metadata: Mapping[str, str], key: str, what: str) -> float | None:
    """The number under `key` (None: absent); ValueError unless it is > 0."""
    raw = metadata.get(key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"the trigger's `{key}` must be a number > 0 ({what}), got {raw!r}")
    return value


class ExternalScaler:
    def __init__(self, load: Load, router: Router) -> None:
        self.load = load
        self.router = router

    async def _trigger(self, ref: pb.ScaledObjectRef, context: Context) -> Trigger:
        """The trigger, its rate defaulted to the pool's engine's."""
        try:
            trigger = parse_trigger(ref.scalerMetadata)
        except ValueError as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{_who(ref)}: {e}")
        pools = {p.name: p for p in self.router.catalog.pools}
        if trigger.pool not in pools:
            await _abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"{_who(ref)}: pool {trigger.pool!r} is not in the frontend's route table "
                f"(pools: {', '.join(pools) or 'none'})",
            )
        if trigger.audio_seconds_per_replica is None:
            rate = pools[trigger.pool].capability_set.audio_seconds_per_replica
            trigger = replace(trigger, audio_seconds_per_replica=rate)
        return trigger

    async def _active(self, pool: str) -> bool:
        return total(await self.load.reports(), pool) > 0

    async def is_active(self, ref: pb.ScaledObjectRef, context: Context) -> pb.IsActiveResponse:
        trigger = await self._trigger(ref, context)
        return pb.IsActiveResponse(result=await self._active(trigger.pool))

    async def stream_is_active(
        self, ref: pb.ScaledObjectRef, context: Context
    ) -> AsyncIterator[pb.IsActiveResponse]:
        trigger = await self._trigger(ref, context)
        loop = asyncio.get_running_loop()
        last: bool | None = None
        sent_at = -math.inf
        with self.load.demand() as demand:
            while True:
                demand.clear()  # before reading the load: no demand is missed in between
                active = await self._active(trigger.pool)
                if active != last or loop.time() - sent_at >= RESEND_SECONDS:
                    yield pb.IsActiveResponse(result=active)
                    last, sent_at = active, loop.time()
                with suppress(TimeoutError):
                    await asyncio.wait_for(demand.wait(), TICK_SECONDS)

    async def get_metric_spec(
        self, ref: pb.ScaledObjectRef, context: Context
    ) -> pb.GetMetricSpecResponse:
        trigger = await self._trigger(ref, context)
        target = trigger.target_queue_seconds
        spec = pb.MetricSpec(
            metricName=trigger.metric, targetSize=max(1, round(target)), targetSizeFloat=target
        )
        return pb.GetMetricSpecResponse(metricSpecs=[spec])

    async def get_metrics(
        self, request: pb.GetMetricsRequest, context: Context
    ) -> pb.GetMetricsResponse:
        trigger = await self._trigger(request.scaledObjectRef, context)
        assert trigger.audio_seconds_per_replica is not None  # `_trigger` defaults it
        reports = await self.load.reports()
        target, rate = trigger.target_queue_seconds, trigger.audio_seconds_per_replica
        value = work_seconds(reports, trigger.pool, target, rate)
        log.debug("%s: %s = %.3f", _who(request.scaledObjectRef), trigger.metric, value)
        return pb.GetMetricsResponse(
            metricValues=[
                pb.MetricValue(
                    metricName=request.metricName or trigger.metric,
                    metricValue=math.ceil(value),
                    metricValueFloat=value,
                )
            ]
        )

    def handler(self) -> grpc.GenericRpcHandler:
        ref, req = pb.ScaledObjectRef.FromString, pb.GetMetricsRequest.FromString
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            "IsActive": grpc.unary_unary_rpc_method_handler(
                self.is_active, ref, pb.IsActiveResponse.SerializeToString
            ),
            "StreamIsActive": grpc.unary_stream_rpc_method_handler(
                self.stream_is_active, ref, pb.IsActiveResponse.SerializeToString
            ),
            "GetMetricSpec": grpc.unary_unary_rpc_method_handler(
                self.get_metric_spec, ref, pb.GetMetricSpecResponse.SerializeToString
            ),
            "GetMetrics": grpc.unary_unary_rpc_method_handler(
                self.get_metrics, req, pb.GetMetricsResponse.SerializeToString
            ),
        }
        declared = set(SERVICE.methods_by_name)
        if set(handlers) != declared:
            raise RuntimeError(f"scaler handlers {sorted(handlers)} != proto's {sorted(declared)}")
        return grpc.method_handlers_generic_handler(SERVICE.full_name, handlers)


def _who(ref: pb.ScaledObjectRef) -> str:
    return f"ScaledObject {ref.namespace}/{ref.name}"


async def _abort(context: Context, code: grpc.StatusCode, message: str) -> NoReturn:
    log.warning("scaler request refused: %s", message)
    await context.abort(code, message)
    raise AssertionError("unreachable")  # abort raises


async def serve_scaler(load: Load, router: Router, host: str, port: int) -> grpc.aio.Server:
    """Start the gRPC server on `host:port` in the running event loop."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((ExternalScaler(load, router).handler(),))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as e:
        raise RuntimeError(
            f"cannot serve KEDA's external scaler on {address} ({e}): is the port in use? "
            "Choose another (the frontend settings' scaler_port), or null to turn the scaler off"
        ) from e
    await server.start()
    log.info("KEDA external scaler (gRPC %s) on %s", SERVICE.full_name, address)
    return server
