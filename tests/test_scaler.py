"""KEDA's external scaler in the frontend: the trigger's metadata, the load summed over
frontend replicas (audio-seconds over the decode rate), and a real gRPC client against two
frontends over real HTTP."""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import httpx
import pytest
from prometheus_client import REGISTRY
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from testkit.audio import tone_wav
from testkit.frontend import PATIENCE, PRIMARY, SERVED, Frontend, endpoint_slice, pool, wait_until
from testkit.host import free_port
from testkit.standins import Behaviour, Running, serve, vllm_app
from transcription_api.capabilities import Engine, Mode
from transcription_api.frontend import TARGET_QUEUE_SECONDS
from transcription_api.routes import Routes, RouteTable
from transcription_frontend.externalscaler import externalscaler_pb2 as pb
from transcription_frontend.externalscaler.generate import OUTPUTS, generate
from transcription_frontend.load import (
    AudioLoad,
    LoadReport,
    Peers,
    PoolLoad,
    total,
    work_seconds,
)
from transcription_frontend.scaler import Trigger, parse_trigger
from transcription_frontend.work import PRIOR_SECONDS, TAU, DecodeSample

HERE = Path(__file__).parent
STUBS = HERE.parent / "frontend_image/transcription_frontend/externalscaler"


# --------------------------------------------------------------------------- generated code


def test_the_committed_messages_are_what_make_protos_generates(tmp_path: Path) -> None:
    for path in generate(tmp_path):
        committed = STUBS / path.name
        assert path.read_bytes() == committed.read_bytes(), (
            f"{committed} is stale: run `make protos` and commit the result"
        )
    assert {p.name for p in STUBS.glob("*_pb2.py*")} == set(OUTPUTS)


def test_the_proto_is_kedas_service() -> None:
    service = pb.DESCRIPTOR.services_by_name["ExternalScaler"]
    assert service.full_name == "externalscaler.ExternalScaler"
    assert {m.name: (m.input_type.name, m.output_type.name) for m in service.methods} == {
        "IsActive": ("ScaledObjectRef", "IsActiveResponse"),
        "StreamIsActive": ("ScaledObjectRef", "IsActiveResponse"),
        "GetMetricSpec": ("ScaledObjectRef", "GetMetricSpecResponse"),
        "GetMetrics": ("GetMetricsRequest", "GetMetricsResponse"),
    }
    # Field numbers are the wire contract with KEDA.
    numbers = {
        m.name: {f.name: f.number for f in m.fields}
        for m in pb.DESCRIPTOR.message_types_by_name.values()
    }
    assert numbers["ScaledObjectRef"] == {"name": 1, "namespace": 2, "scalerMetadata": 3}
    assert numbers["MetricSpec"] == {"metricName": 1, "targetSize": 2, "targetSizeFloat": 3}
    assert numbers["MetricValue"] == {"metricName": 1, "metricValue": 2, "metricValueFloat": 3}
    assert numbers["GetMetricsRequest"] == {"scaledObjectRef": 1, "metricName": 2}


# --------------------------------------------------------------------------- pure parts


def test_trigger_metadata() -> None:
    metadata = {"pool": "batch", "targetQueueSeconds": "4", "audioSecondsPerReplica": "30",
                "scalerAddress": "x:9090"}  # fmt: skip
    assert parse_trigger(metadata) == Trigger("batch", 4.0, 30.0)
    assert parse_trigger({"pool": "batch"}).metric == "pool-batch"
    # Defaults: the target's, and the engine's rate (None here: the scaler looks it up).
    assert parse_trigger({"pool": "batch"}) == Trigger("batch", TARGET_QUEUE_SECONDS, None)
    # An earlier release's `target` (requests per replica) is ignored, not refused: the
    # frontend and the operator's new ScaledObject may meet during an upgrade.
    assert parse_trigger({"pool": "batch", "target": "2"}) == Trigger("batch")


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (
            {"targetQueueSeconds": "2"},
            "the trigger's metadata has no `pool`: set it to the pool's name",
        ),
        ({"pool": " "}, "has no `pool`"),
        (
            {"pool": "batch", "targetQueueSeconds": ""},
            "the trigger's `targetQueueSeconds` must be a number > 0 (seconds of work per "
            "replica), got ''",
        ),
        ({"pool": "batch", "targetQueueSeconds": "two"}, "got 'two'"),
        ({"pool": "batch", "targetQueueSeconds": "0"}, "got '0'"),
        ({"pool": "batch", "targetQueueSeconds": "-1"}, "got '-1'"),
        ({"pool": "batch", "targetQueueSeconds": "nan"}, "got 'nan'"),
        ({"pool": "batch", "targetQueueSeconds": "inf"}, "got 'inf'"),
        (
            {"pool": "batch", "audioSecondsPerReplica": "0"},
            "the trigger's `audioSecondsPerReplica` must be a number > 0 (audio seconds a "
            "replica decodes a second), got '0'",
        ),
    ],
)
def test_bad_trigger_metadata_says_what_to_fix(metadata: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_trigger(metadata)


def report(instance: str, **pools: tuple[int, int]) -> LoadReport:
    return LoadReport(
        instance=instance, pools={p: PoolLoad(in_flight=f, held=h) for p, (f, h) in pools.items()}
    )


def test_total_sums_in_flight_and_held_over_replicas() -> None:
    reports = [report("a", batch=(2, 1), words=(0, 3)), report("b", batch=(0, 1)), report("c")]
    assert total(reports, "batch") == 4
    assert total(reports, "words") == 3
    assert total(reports, "gone") == 0
    assert total([], "batch") == 0


def audio_report(instance: str, sessions: int = 0, decoded: float = 0.0, busy: float = 0.0,
                 window: float = 0.0, **stages: float) -> LoadReport:  # fmt: skip
    load = PoolLoad(sessions=sessions, audio=AudioLoad(**stages),
                    decoding=DecodeSample(decoded=decoded, busy=busy, window=window))  # fmt: skip
    return LoadReport(instance=instance, pools={"batch": load})


def test_the_work_is_the_audio_of_every_replica_over_the_decode_rate() -> None:
    reports = [audio_report("a", arriving=3, queued=10, in_flight=20, spilled=7),
               audio_report("b", in_flight=20), audio_report("c")]  # fmt: skip
    # Nothing measured yet: the default rate (4 s of audio a second), 60 s of audio.
    assert work_seconds(reports, "batch", 10, 4) == pytest.approx(60 / 4)
    assert work_seconds(reports, "other", 10, 4) == 0
    # A realtime session counts as the audio it can bring while the queue drains: 10 s.
    with_session = [*reports, audio_report("d", sessions=2)]
    assert work_seconds(with_session, "batch", 10, 4) == pytest.approx(80 / 4)


def test_the_decode_rate_is_measured_on_every_replica_and_the_default_weighs_little() -> None:
    def rate(*decoding: tuple[float, float, float], default: float = 4) -> float:
        reports = [audio_report(str(i), queued=100, decoded=d, busy=b, window=w)
                   for i, (d, b, w) in enumerate(decoding)]  # fmt: skip
        return 100 * len(reports) / work_seconds(reports, "batch", 10, default)

    assert rate((0, 0, 0)) == 4  # the default until something is measured
    # Measured: 300 s of audio in 10 s busy, with the default's 10 s: (300 + 40) / 20.
    assert PRIOR_SECONDS == 10 and rate((300, 10, 120)) == pytest.approx(17)
    assert rate((3000, 100, 120)) == pytest.approx(3040 / 110)  # the measurement dominates
    # Two replicas whose requests share the endpoints: both were busy all along (120 s of
    # 120), each with half the audio. Summed, their busy time would halve the rate; it is
    # capped at the time measured.
    shared = rate((1500, 120, 120), (1500, 120, 120))
    assert shared == pytest.approx((3000 + 40) / (120 + 10))
    # Apart in time (each busy 50 s of 120): their busy times add up.
    assert rate((500, 50, 120), (500, 50, 120)) == pytest.approx((1000 + 40) / (100 + 10))


def peer_app(body: Callable[[], Any], hits: list[str]) -> Starlette:
    async def load(request: Request) -> Response:
        hits.append(request.url.path)
        doc = body()
        return JSONResponse(doc) if not isinstance(doc, bytes) else Response(doc)

    return Starlette(routes=[Route("/internal/load", load)])


def test_peers_are_summed_cached_and_left_out_when_they_fail() -> None:
    hits: list[str] = []
    good = report("peer-1", batch=(2, 3)).model_dump()
    me = report("me", batch=(100, 100)).model_dump()  # myself, listed among my peers
    with (
        serve(peer_app(lambda: good, hits)) as p1,
        serve(peer_app(lambda: me, hits)) as p2,
        serve(peer_app(lambda: b"not json", hits)) as p3,
    ):
        dead = f"http://127.0.0.1:{free_port()}"
        errors = REGISTRY.get_sample_value("transcription_frontend_peer_load_errors_total") or 0.0

        async def main() -> None:
            peers = Peers("me")
            async with aiohttp.ClientSession() as client:
                peers.client = client
                assert await peers.reports() == []  # no peers known yet
                peers.set_urls([p1.url, p2.url, p3.url, dead])
                got = await peers.reports()
                assert [r.instance for r in got] == ["peer-1"]
                assert total(got, "batch") == 5
                n = len(hits)
                await asyncio.gather(*(peers.reports() for _ in range(5)))
                assert len(hits) == n  # cached for a second
                peers.set_urls([p1.url])  # a new peer list is fetched at once
                assert total(await peers.reports(), "batch") == 5
                assert len(hits) == n + 1

        asyncio.run(main())
        after = REGISTRY.get_sample_value("transcription_frontend_peer_load_errors_total") or 0.0
        assert after == errors + 2  # the garbage one and the dead one


# --------------------------------------------------------------------------- over gRPC

SERVICE = "/externalscaler.ExternalScaler/"
THREE = tone_wav(3.0)  # 3 s of audio, by its header: the work each request brings


class Scaler:
    """A gRPC client of the scaler, as KEDA's is (insecure channel, the four methods)."""

    def __init__(self, port: int) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.is_active = self.channel.unary_unary(
            SERVICE + "IsActive",
            pb.ScaledObjectRef.SerializeToString,
            pb.IsActiveResponse.FromString,
        )
        self.stream_is_active = self.channel.unary_stream(
            SERVICE + "StreamIsActive",
            pb.ScaledObjectRef.SerializeToString,
            pb.IsActiveResponse.FromString,
        )
        self.get_metric_spec = self.channel.unary_unary(
            SERVICE + "GetMetricSpec",
            pb.ScaledObjectRef.SerializeToString,
            pb.GetMetricSpecResponse.FromString,
        )
        self.get_metrics = self.channel.unary_unary(
            SERVICE + "GetMetrics",
            pb.GetMetricsRequest.SerializeToString,
            pb.GetMetricsResponse.FromString,
        )

    def value(self, ref: pb.ScaledObjectRef) -> float:
        r = self.get_metrics(
            pb.GetMetricsRequest(scaledObjectRef=ref, metricName="pool-batch"), timeout=PATIENCE
        )
        (v,) = r.metricValues
        # KEDA reads the float; the integer is for scalers that do not, rounded up.
        assert v.metricName == "pool-batch" and v.metricValue == math.ceil(v.metricValueFloat)
        return float(v.metricValueFloat)


def ref(pool: str = "batch", target: str = "2", rate: str | None = "3") -> pb.ScaledObjectRef:
    rated = {"audioSecondsPerReplica": rate} if rate else {}
    return pb.ScaledObjectRef(
        name=f"whisper-{pool}", namespace="speech",
        scalerMetadata={"scalerAddress": "whisper.speech:9090", "pool": pool,
                        "targetQueueSeconds": target, **rated},
    )  # fmt: skip


def held(fe: Frontend) -> int:
    """Requests this replica holds for pool batch (the metrics registry is per process)."""
    return int(httpx.get(f"{fe.url}/internal/load").json()["pools"]["batch"]["held"])


@pytest.fixture
def slow() -> Iterator[tuple[Running, Behaviour]]:
    b = Behaviour(delay=2.0)
    with serve(vllm_app(SERVED, b)) as running:
        yield running, b


@pytest.fixture
def two_frontends(slow: tuple[Running, Behaviour]) -> Iterator[tuple[Frontend, Frontend]]:
    """Two replicas behind the Service `whisper`, each knowing the other from its slices."""
    fes = [
        Frontend(RouteTable(model=PRIMARY, pools=[pool("batch", [slow[0].url])]),
                 scaler_port=free_port(), host="127.0.0.1", peers_service="whisper")
        for _ in range(2)
    ]  # fmt: skip
    for fe in fes:
        for i, other in enumerate(fes):  # one slice per port, as for pods on different ports
            fe.gateway.apply_slice("ADDED", endpoint_slice("whisper", [other.url], name=str(i)))
    yield fes[0], fes[1]
    for fe in fes:
        fe.running.stop()


def test_the_scaler_answers_with_the_load_of_every_frontend_replica(
    two_frontends: tuple[Frontend, Frontend], slow: tuple[Running, Behaviour]
) -> None:
    """(The level's average, `work.SMOOTH_SECONDS`, is shortened to 0.2 s here: gone 1 s
    after the last answer.)"""
    a, b = two_frontends
    for fe in (a, b):
        fe.gateway.work.smooth = 0.2
    scalers = [Scaler(fe.gateway.settings.scaler_port or 0) for fe in (a, b)]
    spec = scalers[0].get_metric_spec(ref(target="2.5"), timeout=PATIENCE)
    assert [(s.metricName, s.targetSize, s.targetSizeFloat) for s in spec.metricSpecs] == [
        ("pool-batch", 2, 2.5)
    ]
    assert not scalers[0].is_active(ref(), timeout=PATIENCE).result
    assert scalers[0].value(ref()) == 0

    slow[1].hold = True  # in flight until the new pod below, however loaded the machine
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        # Two requests of 3 s of audio in flight at the worker through A...
        done = [ex.submit(a.post, {"model": PRIMARY}, THREE) for _ in range(2)]
        wait_until(lambda: slow[1].in_flight == 2, what="two requests in flight")
        # ...whose pod then terminates: they go on; new ones are held, on A and on B.
        a.endpoints("batch", [], terminating=[slow[0].url])
        b.endpoints("batch", [])
        wait_until(
            lambda: a.router.endpoints("batch") == [] == b.router.endpoints("batch"),
            what="discovery",
        )
        done += [ex.submit(fe.post, {"model": PRIMARY}, THREE) for fe in (a, b)]
        wait_until(lambda: held(a) == held(b) == 1, what="holds")
        # Either replica answers with the total: 2 in flight + 2 held, 12 s of audio, over
        # the 3 s a second the trigger says a replica decodes (nothing measured yet): 4 s
        # of one replica's work (once its peer's report, cached for a second, is fresh).
        for s in scalers:
            wait_until(lambda s=s: s.value(ref()) == 4, what="the total of 4")
            assert s.is_active(ref(), timeout=PATIENCE).result
        # A new pod becomes ready: everything is served, and the load goes back to 0.
        for fe in (a, b):
            fe.endpoints("batch", [slow[0].url])
        slow[1].hold = False
        assert [f.result(timeout=PATIENCE).status_code for f in done] == [200] * 4
    wait_until(lambda: all(s.value(ref()) == 0 for s in scalers), what="the load to drain")
    assert not scalers[1].is_active(ref(), timeout=PATIENCE).result


def test_a_peer_that_does_not_answer_is_left_out(
    two_frontends: tuple[Frontend, Frontend], slow: tuple[Running, Behaviour]
) -> None:
    a, b = two_frontends
    dead = f"http://127.0.0.1:{free_port()}"
    a.gateway.apply_slice("ADDED", endpoint_slice("whisper", [dead], name="dead"))
    b.endpoints("batch", [])
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        pending = ex.submit(b.post, {"model": PRIMARY}, THREE)
        wait_until(lambda: held(b) == 1, what="hold")
        # B's 3 s of audio at 3 s a second, despite the dead peer
        assert Scaler(a.gateway.settings.scaler_port or 0).value(ref()) == 1
        assert a.metric("transcription_frontend_peer_load_errors_total") >= 1
        b.endpoints("batch", [slow[0].url])
        assert pending.result(timeout=PATIENCE).status_code == 200


def test_stream_is_active_pushes_demand_at_once_and_idleness_after(
    two_frontends: tuple[Frontend, Frontend], slow: tuple[Running, Behaviour]
) -> None:
    a, b = two_frontends
    for fe in (a, b):
        fe.endpoints("batch", [])  # the pool is at zero
    pushed: list[tuple[float, bool]] = []
    ended: list[grpc.StatusCode] = []
    stream = Scaler(a.gateway.settings.scaler_port or 0).stream_is_active(ref())

    def consume() -> None:
        try:
            for r in stream:
                pushed.append((time.monotonic(), r.result))
        except grpc.RpcError as e:
            ended.append(e.code())

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    try:
        wait_until(lambda: len(pushed) == 1, what="the first answer")
        assert pushed[0][1] is False
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            # A request held here: pushed at once, not at the next tick.
            sent = time.monotonic()
            first = ex.submit(a.post, {"model": PRIMARY})
            wait_until(lambda: len(pushed) == 2, what="a push")
            assert pushed[1][1] is True and pushed[1][0] - sent < 0.9  # not at the next 1 s tick
            a.endpoints("batch", [slow[0].url])
            assert first.result(timeout=PATIENCE).status_code == 200
            wait_until(lambda: len(pushed) == 3, what="the idle push")
            assert pushed[2][1] is False
            # A request held on the other replica reaches this stream within a tick or two.
            sent = time.monotonic()
            second = ex.submit(b.post, {"model": PRIMARY})
            wait_until(lambda: len(pushed) == 4, what="the peer's demand")
            assert pushed[3][1] is True and pushed[3][0] - sent < 4
            b.endpoints("batch", [slow[0].url])
            assert second.result(timeout=PATIENCE).status_code == 200
    finally:
        stream.cancel()
        reader.join(timeout=5)
    assert ended == [grpc.StatusCode.CANCELLED]  # by this client; the server never ended it


def test_a_preferred_pool_at_zero_gets_the_demand_its_fallback_serves(
    slow: tuple[Running, Behaviour],
) -> None:
    """A continuous pool at zero whose traffic a sequential pool also serves must still be
    woken: what the fallback serves in its place counts as its load."""
    table = RouteTable(model=PRIMARY, pools=[
        pool("batch", []),
        pool("words", [slow[0].url], engine=Engine.FASTER_WHISPER, mode=Mode.SEQUENTIAL),
    ])  # fmt: skip
    fe = Frontend(table, scaler_port=free_port(), host="127.0.0.1")
    fe.gateway.work.smooth = 0.2  # the level's average: gone 1 s after the answer
    try:
        s = Scaler(fe.gateway.settings.scaler_port or 0)
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            served = ex.submit(fe.post, {"model": PRIMARY}, THREE)
            wait_until(lambda: slow[1].in_flight == 1, what="the request at the fallback")
            load = httpx.get(f"{fe.url}/internal/load").json()["pools"]
            counts = {p: {k: v for k, v in load[p].items() if isinstance(v, int)} for p in load}
            assert counts == {"batch": {"in_flight": 0, "held": 0, "spilled": 1, "sessions": 0},
                              "words": {"in_flight": 1, "held": 0, "spilled": 0, "sessions": 0}}  # fmt: skip
            # Its audio: in flight at the fallback, and demand for the pool it prefers.
            nothing = {"arriving": 0.0, "queued": 0.0, "in_flight": 0.0, "spilled": 0.0}
            assert load["batch"]["audio"] == {**nothing, "spilled": 3.0}
            assert load["words"]["audio"] == {**nothing, "in_flight": 3.0}
            assert s.value(ref()) == 1 and s.is_active(ref(), timeout=PATIENCE).result
            # Without a rate in the trigger, the engine's default: vLLM continuous, 20.
            assert s.value(ref(rate=None)) == pytest.approx(3 / 20)
            assert served.result(timeout=PATIENCE).status_code == 200
        wait_until(lambda: s.value(ref()) == 0, what="the level to fade")
    finally:
        fe.running.stop()


def test_scaler_errors_say_what_is_wrong(two_frontends: tuple[Frontend, Frontend]) -> None:
    s = Scaler(two_frontends[0].gateway.settings.scaler_port or 0)
    with pytest.raises(grpc.RpcError) as e:
        s.get_metric_spec(ref(target="zero"), timeout=PATIENCE)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == (
        "ScaledObject speech/whisper-batch: the trigger's `targetQueueSeconds` must be a "
        "number > 0 (seconds of work per replica), got 'zero'"
    )
    with pytest.raises(grpc.RpcError) as e:
        s.is_active(ref(pool="words"), timeout=PATIENCE)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert "pool 'words' is not in the frontend's route table (pools: batch)" in e.value.details()
    # KEDA's optional StreamMetricSpec: UNIMPLEMENTED, on which KEDA falls back to polling.
    missing = s.channel.unary_stream(SERVICE + "StreamMetricSpec", pb.ScaledObjectRef.SerializeToString,
                                     pb.GetMetricSpecResponse.FromString)  # fmt: skip
    with pytest.raises(grpc.RpcError) as e:
        list(missing(ref(), timeout=PATIENCE))
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert s.value(ref()) == 0  # still serving
    assert not math.isnan(s.value(ref()))


def multipart(before: list[tuple[str, str]], wav: bytes, after: list[tuple[str, str]]
              ) -> tuple[bytes, str]:  # fmt: skip
    """A form: `before`'s fields, the file, `after`'s fields."""

    def field(k: str, v: str) -> bytes:
        return f'--b\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()

    file = (b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            b"Content-Type: audio/wav\r\n\r\n" + wav + b"\r\n")  # fmt: skip
    body = b"".join([*(field(k, v) for k, v in before), file, *(field(k, v) for k, v in after)])
    return body + b"--b--\r\n", "multipart/form-data; boundary=b"


@contextmanager
def stalled(fe: Frontend, body: bytes, ctype: str
            ) -> Iterator[tuple[threading.Event, concurrent.futures.Future[httpx.Response]]]:  # fmt: skip
    """An upload of `body` whose second half waits for the event."""
    go = threading.Event()

    def upload() -> Iterator[bytes]:
        yield body[: len(body) // 2]
        go.wait(10)
        yield body[len(body) // 2 :]

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        answer = ex.submit(
            httpx.post, f"{fe.url}/v1/audio/transcriptions", content=upload(),
            headers={"content-type": ctype, "content-length": str(len(body))}, timeout=30,
        )  # fmt: skip
        try:
            yield go, answer
        finally:
            go.set()


BACKLOG = "transcription_frontend_backlog_audio_seconds"


def decayed(seconds: float, since: float) -> float:
    """The least a decode sum of `seconds` answered after `since` can read now: the sums
    decay from the answer on (`TAU`), however late a loaded machine reads them."""
    return seconds * math.exp(-(time.monotonic() - since) / TAU)


def test_an_upload_counts_while_it_arrives_and_measures_the_decode_rate_once_answered(
    slow: tuple[Running, Behaviour],
) -> None:
    """The audio of an upload still arriving counts for its pool as soon as the file's
    header has come (a request parsed slowly on a busy node is not hidden from the
    autoscaler), then in flight at the worker; its answer measures the decode rate."""
    fe = Frontend(RouteTable(model=PRIMARY, pools=[pool("batch", [slow[0].url])]))
    try:
        with stalled(fe, *multipart([("model", PRIMARY)], tone_wav(10.0), [])) as (go, answer):
            wait_until(lambda: fe.metric(BACKLOG, pool="batch", stage="arriving") == 10.0,
                       what="the upload's 10 s counted while it arrives")  # fmt: skip
            assert slow[1].in_flight == 0
            # In the metric, not in what wakes a pool from zero: its other fields may yet
            # send it to another pool.
            assert total([fe.gateway.load.local()], "batch") == 0
            sent = time.monotonic()
            go.set()
            wait_until(lambda: slow[1].in_flight == 1, what="the request at the worker")
            assert fe.metric(BACKLOG, pool="batch", stage="in_flight") == 10.0
            assert fe.metric(BACKLOG, pool="batch", stage="arriving") == 0
            assert answer.result(timeout=PATIENCE).status_code == 200
        assert fe.metric(BACKLOG, pool="batch", stage="in_flight") == 0
        # 10 s of audio over the time the worker was busy with it: its 2 s, and the hops
        # (however long a loaded machine makes them), so at most 5 s a second.
        rate = fe.metric("transcription_frontend_decode_rate", pool="batch")
        decoding = fe.gateway.load.local().pools["batch"].decoding
        assert decayed(10.0, since=sent) <= decoding.decoded <= 10.0
        assert 0 < rate <= 5.0, rate
        # Both sums decay alike: their ratio is still the rate the answer set.
        assert rate == pytest.approx(decoding.decoded / decoding.busy, rel=0.01)
    finally:
        fe.running.stop()


def test_behind_a_gateway_an_upload_counts_for_the_deployment_its_model_names(
    slow: tuple[Running, Behaviour],
) -> None:
    """Many deployments behind one frontend: an upload counts for the first pool of the
    deployment its `model` names, from its header when `model` comes first, and from the
    `model` field when it comes after the file."""
    tables = [
        RouteTable(model=name, deployment=f"speech/{name}", namespace="speech",
                   pools=[pool(f"{name}/batch", [slow[0].url]).model_copy(
                       update={"worker_model": PRIMARY})])  # the stand-in's name
        for name in ("whisper", "tiny")
    ]  # fmt: skip
    fe = Frontend(Routes(deployments=tables))

    def arriving() -> dict[str, float]:
        return {p: fe.metric(BACKLOG, pool=p, stage="arriving")
                for p in ("whisper/batch", "tiny/batch")}  # fmt: skip

    try:
        body = multipart([("model", "tiny")], tone_wav(6.0), [])
        with stalled(fe, *body) as (go, answer):
            wait_until(lambda: arriving() == {"whisper/batch": 0, "tiny/batch": 6.0},
                       what="the upload counted for tiny")  # fmt: skip
            go.set()
            assert answer.result(timeout=PATIENCE).status_code == 200
        body = multipart([], tone_wav(6.0), [("model", "whisper")])
        with stalled(fe, *body) as (go, answer):
            time.sleep(0.3)  # its header has arrived; which deployment it goes to, not yet
            assert arriving() == {"whisper/batch": 0, "tiny/batch": 0}
            sent = time.monotonic()
            go.set()
            assert answer.result(timeout=PATIENCE).status_code == 200
        decoded = fe.gateway.load.local().pools["whisper/batch"].decoding.decoded
        assert decayed(6.0, since=sent) <= decoded <= 6.0
    finally:
        fe.running.stop()
