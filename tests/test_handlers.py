"""kopf wiring: the watch streams status reads are filtered by the API server; with leader
election, only the leader's workers reconcile."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import kopf
import pytest
from kopf._cogs.structs.references import Resource
from prometheus_client import REGISTRY

from testkit.operator import RecordingKube
from transcription_api.v1alpha1 import API_VERSION, KIND
from transcription_operator import handlers, manager, metrics
from transcription_operator.leader import ElectionConfig
from transcription_operator.main import parse_args
from transcription_operator.names import MANAGED_BY_LABEL, PART_OF
from transcription_operator.reconciler import Result
from transcription_operator.scope import Scope


def test_pods_and_events_are_filtered_server_side() -> None:
    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    pods = Resource("", "v1", "pods", kind="Pod", namespaced=True)
    events = Resource("", "v1", "events", kind="Event", namespaced=True)
    deployments = Resource("apps", "v1", "deployments", kind="Deployment", namespaced=True)
    # Only the operator's own pods, and only Warning Events about pods, leave the API server.
    assert settings.watching.label_selectors.collect(pods) == [
        "app.kubernetes.io/managed-by=transcription-operator"
    ]
    assert settings.watching.field_selectors.collect(events) == [
        "involvedObject.kind=Pod,type=Warning"
    ]
    assert settings.watching.label_selectors.collect(deployments) == []
    assert settings.watching.field_selectors.collect(pods) == []


# --------------------------------------------------------------------------- leader election


class Recorder:
    """Stands in for the Reconciler: records which keys were reconciled."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def reconcile(self, kind: str, namespace: str, name: str) -> Result:
        assert kind == KIND
        self.calls.append((namespace, name))
        return Result("unchanged")


class Election:
    """Stands in for LeaderElection: leading when told."""

    def __init__(self) -> None:
        self.leading = False
        self.config = ElectionConfig(namespace="ops", name="lease", identity="me")

    def is_leading(self) -> bool:
        return self.leading

    async def release(self) -> None:
        self.released = True


def td(name: str) -> dict[str, Any]:
    return {"kind": KIND, "apiVersion": API_VERSION, "metadata": {"namespace": "ns", "name": name}}


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.01)


def test_a_standby_keeps_its_cache_but_reconciles_only_while_leading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def main() -> None:
        rt = manager.Runtime()
        monkeypatch.setattr(manager, "RUNTIME", rt)
        recorder, election = Recorder(), Election()
        rt.reconciler = recorder  # type: ignore[assignment]
        rt.election = election  # type: ignore[assignment]
        workers = [asyncio.create_task(manager._worker(i)) for i in range(2)]
        manager._stopped_leading()
        # Standing by: events fill the cache and the queue, nothing is reconciled.
        for name in ("a", "b"):
            rt.cache.put(td(name))
        rt.queue.add((KIND, "ns", "a"))
        await settle()
        assert recorder.calls == [] and metrics.LEADER._value.get() == 0
        # Elected: every known resource at once, not only those with a queued event.
        election.leading = True
        manager._started_leading()
        await settle()
        assert sorted(recorder.calls) == [("ns", "a"), ("ns", "b")]
        assert metrics.LEADER._value.get() == 1
        # The lease lapses: the very next key waits, even before the loop says so.
        election.leading = False
        rt.queue.add((KIND, "ns", "a"))
        await settle()
        assert len(recorder.calls) == 2
        manager._stopped_leading()
        await settle()
        assert len(recorder.calls) == 2 and rt.queue.depth == 1  # kept for the next term
        # Leading again: the waiting key and everything else.
        election.leading = True
        manager._started_leading()
        await settle()
        assert sorted(recorder.calls[2:]) == [("ns", "a"), ("ns", "b")]
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    asyncio.run(main())


def test_graceful_shutdown_waits_for_the_reconcile_in_flight_then_releases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def main() -> None:
        rt = manager.Runtime()
        monkeypatch.setattr(manager, "RUNTIME", rt)
        election = Election()
        election.leading = True
        rt.election = election  # type: ignore[assignment]
        order: list[str] = []

        class Slow(Recorder):
            def reconcile(self, kind: str, namespace: str, name: str) -> Result:
                time.sleep(0.3)
                order.append("reconciled")
                return Result("unchanged")

        rt.reconciler = Slow()  # type: ignore[assignment]
        manager._started_leading()
        worker = asyncio.create_task(manager._worker(0))
        rt.queue.add((KIND, "ns", "a"))
        await asyncio.sleep(0.05)
        assert rt.in_flight == 1
        await manager._hand_over(election)  # type: ignore[arg-type]
        order.append("released" if election.released else "kept")
        assert order == ["reconciled", "released"]
        assert not rt.leading.is_set() and metrics.LEADER._value.get() == 0
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)

    asyncio.run(main())


def test_a_failed_election_loop_stops_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither leading nor standing by is no state to stay in: the process is restarted."""
    sent: list[int] = []
    monkeypatch.setattr(manager.os, "kill", lambda pid, sig: sent.append(sig))

    async def main() -> None:
        async def broken() -> None:
            raise ValueError("a Lease this replica cannot read")

        failed = asyncio.create_task(broken())
        await asyncio.gather(failed, return_exceptions=True)
        manager._election_ended(failed)
        assert sent == [signal.SIGTERM]
        cancelled = asyncio.create_task(asyncio.sleep(10))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        manager._election_ended(cancelled)  # shutdown: nothing more
        assert sent == [signal.SIGTERM]

    asyncio.run(main())


# --------------------------------------------------------------------------- watch gaps


def child(kind: str, name: str, instance: str) -> dict[str, Any]:
    labels = {"app.kubernetes.io/instance": instance, MANAGED_BY_LABEL: PART_OF}
    meta = {"namespace": "ns", "name": name, "labels": labels}
    return {
        "kind": kind,
        "apiVersion": "v1",
        "metadata": {**meta, "uid": f"u-{name}", "resourceVersion": "1"},
    }


def test_a_child_deleted_while_the_watches_were_away_is_reconciled_after_they_relist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf's relist after a gap reports what exists, never what was deleted meanwhile:
    the operator relists itself once kopf's listings settle, forgets the deleted child and
    reconciles its resource (which applies it again)."""
    monkeypatch.setattr(manager, "RELIST_SETTLE_SECONDS", 0.05)
    monkeypatch.setattr(manager, "RELIST_RETRY_SECONDS", 0.05)

    async def main() -> None:
        rt = manager.Runtime()
        monkeypatch.setattr(manager, "RUNTIME", rt)
        scaler, frontend = child("Service", "w-scaler", "w"), child("Service", "w", "w")
        resource = {
            **td("w"),
            "metadata": {**td("w")["metadata"], "uid": "u-w", "resourceVersion": "1"},
        }
        kube = RecordingKube()
        for obj in (resource, scaler, frontend):
            kube.server.put(obj)
        manager.relist(kube, Scope())
        assert rt.cache.get("Service", "ns", "w-scaler") is not None
        relister = asyncio.create_task(manager._relister(kube))
        kube.server.down = True  # the API server goes away; the scaler Service is deleted meanwhile
        kube.server.remove("Service", "ns", "w-scaler")
        # kopf's watches come back and list what exists (as events with no type).
        await handlers.resource_event(event={"type": None}, body=resource)  # type: ignore[arg-type]
        await asyncio.sleep(0.2)  # the first relist fails: the API server is still away
        assert rt.cache.get("Service", "ns", "w-scaler") is not None and rt.queue.depth == 1
        kube.server.down = False
        await asyncio.sleep(0.3)
        assert rt.cache.get("Service", "ns", "w-scaler") is None
        assert rt.cache.get("Service", "ns", "w") is not None
        assert await asyncio.wait_for(rt.queue.get(), 1) == (KIND, "ns", "w")
        relister.cancel()
        await asyncio.gather(relister, return_exceptions=True)

    asyncio.run(main())


def resynced() -> float:
    """Reconciles the periodic resync asked for, in this process so far."""
    value = REGISTRY.get_sample_value("transcription_operator_enqueued_total", {"by": "resync"})
    return value or 0.0


def test_the_resync_period_reconciles_every_cached_resource_from_the_cache() -> None:
    """Every `resync_seconds` (`--resync-period`) each cached resource is queued again, as
    "resync" (the reconciles read the cache: nothing is written when nothing drifted)."""

    async def main() -> None:
        rt = manager.Runtime()
        rt.resync_seconds = 0.1
        for name in ("a", "b"):
            rt.remember(
                KIND,
                API_VERSION,
                "ADDED",
                {**td(name), "metadata": {**td(name)["metadata"], "uid": name}},
            )
        kube = RecordingKube()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(manager, "RUNTIME", rt)
            before = resynced()
            relister = asyncio.create_task(manager._relister(kube))
            keys = {await asyncio.wait_for(rt.queue.get(), 1) for _ in range(2)}
            relister.cancel()
            await asyncio.gather(relister, return_exceptions=True)
        assert keys == {(KIND, "ns", "a"), (KIND, "ns", "b")}
        assert resynced() >= before + 2

    asyncio.run(main())


@pytest.mark.parametrize(
    ("argv", "env", "seconds"),
    [([], {}, 300.0), (["--resync-period=30s"], {}, 30.0), ([], {"RESYNC_PERIOD": "1m"}, 60.0)],
)
def test_the_resync_period_flag_takes_a_duration(
    argv: list[str], env: dict[str, str], seconds: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RESYNC_PERIOD", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert parse_args(argv).resync_period == seconds


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--resync-period=0s"], "'0s' is not a positive duration: use e.g. 5m"),
        (["--resync-period=often"], "invalid duration 'often'"),
    ],
)
def test_a_bad_resync_period_exits_with_a_clear_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_patterned_scope_keeps_only_the_namespaces_it_admits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a pattern the operator reads cluster-wide (one watch per kind) and keeps only
    what its scope admits: a watch event from another namespace is neither cached nor
    queued, and a relist leaves it out, namespaces included."""

    def in_ns(obj: dict[str, Any], ns: str) -> dict[str, Any]:
        meta = {**obj["metadata"], "namespace": ns, "uid": f"u-{ns}", "resourceVersion": "1"}
        return {**obj, "metadata": meta}

    async def main() -> None:
        rt = manager.Runtime()
        rt.scope = Scope.of(["team-*", "!team-ci"])
        monkeypatch.setattr(manager, "RUNTIME", rt)
        ours, ci, other = (in_ns(td("w"), ns) for ns in ("team-a", "team-ci", "other"))
        for body in (ours, ci, other):
            await handlers.resource_event(event={"type": "ADDED"}, body=body)  # type: ignore[arg-type]
        assert rt.queue.depth == 1 and await rt.queue.get() == (KIND, "team-a", "w")
        assert (
            rt.cache.get(KIND, "team-ci", "w") is None and rt.cache.get(KIND, "other", "w") is None
        )
        kube = RecordingKube()
        for obj in (ours, ci, other):
            kube.server.put(obj)
        for ns in ("team-a", "team-ci", "other"):
            kube.server.put({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": ns}})
        manager.relist(kube, rt.scope)
        assert rt.cache.keys(KIND) == [("team-a", "w")]
        assert rt.cache.keys("Namespace") == [("", "team-a")]

    asyncio.run(main())


def test_the_echo_of_the_operators_own_write_asks_for_no_reconcile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reconciler caches what the API server answered to its write; the watch then
    delivers that same version: no news, no reconcile. A newer version, a deletion or a
    listing is news; an older version (a late event) is not."""

    async def main() -> None:
        rt = manager.Runtime()
        monkeypatch.setattr(manager, "RUNTIME", rt)

        def version(rv: str) -> dict[str, Any]:
            return {**td("w"), "metadata": {**td("w")["metadata"], "uid": "u", "resourceVersion": rv}}  # fmt: skip

        def asked() -> dict[str, float]:
            return {KIND: metrics.ENQUEUED.labels(by=KIND)._value.get()}

        rt.cache.put(version("5"))  # the operator's own status write, as the server stored it
        before = asked()
        for event, rv in (("MODIFIED", "5"), ("MODIFIED", "4")):  # the echo, a late event
            await handlers.resource_event(event={"type": event}, body=version(rv))  # type: ignore[arg-type]
        assert asked() == before and rt.queue.depth == 0
        await handlers.resource_event(event={"type": "MODIFIED"}, body=version("6"))  # type: ignore[arg-type]
        await handlers.resource_event(event={"type": None}, body=version("6"))  # type: ignore[arg-type]
        assert asked()[KIND] == before[KIND] + 2 and rt.queue.depth == 1  # one key, deduplicated
        # Children alike: the applied object, cached from the answer, then its echo.
        svc = child("Service", "w", "w")
        rt.cache.put(svc)
        assert rt.remember("Service", "v1", "MODIFIED", svc)[1] is False
        newer = {**svc, "metadata": {**svc["metadata"], "resourceVersion": "2"}}
        assert rt.remember("Service", "v1", "MODIFIED", newer)[1] is True

    asyncio.run(main())


@pytest.mark.parametrize(("level", "kopf_objects"), [("INFO", "WARNING"), ("DEBUG", "NOTSET")])
def test_kopf_logs_each_watch_event_only_at_debug(level: str, kopf_objects: str) -> None:
    import logging

    from transcription_operator.main import configure_logging

    logger = logging.getLogger("kopf.objects")
    logger.setLevel(logging.NOTSET)
    configure_logging(level)
    assert logging.getLevelName(logger.level) == kopf_objects
    logger.setLevel(logging.NOTSET)


# --------------------------------------------------------------------------- both kinds


def test_events_cross_enqueue_gateways_and_the_deployments_they_select(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deployment's event enqueues it and every gateway; a gateway's, itself and the
    deployments it selected before and after the change; a child's, its controller, of
    either kind."""
    from testkit.resources import make_gateway, make_td
    from transcription_api.v1alpha1 import GATEWAY_KIND
    from transcription_operator.config import OperatorConfig
    from transcription_operator.kinds import KINDS
    from transcription_operator.reconciler import Reconciler

    def body(obj: Any, rv: str) -> dict[str, Any]:
        out: dict[str, Any] = obj.model_dump(by_alias=True, exclude_none=True, mode="json")
        out["metadata"]["resourceVersion"] = rv
        return out

    async def queued() -> set[tuple[str, str, str]]:
        keys = set()
        while rt.queue.depth:
            key = await rt.queue.get()
            rt.queue.done(key)
            keys.add(key)
        return keys

    rt = manager.Runtime()
    monkeypatch.setattr(manager, "RUNTIME", rt)
    rt.reconciler = Reconciler(RecordingKube(), rt.cache, OperatorConfig())

    async def main() -> None:
        for name, team in (("a", "x"), ("b", "y")):
            td = make_td({"model": {"name": f"m-{name}"}}, name=name, namespace="ns")
            labelled = body(td, "1")
            labelled["metadata"]["labels"] = {"team": team}
            await handlers.resource_event(event={"type": "ADDED"}, body=labelled)  # type: ignore[arg-type]
        assert await queued() == {(KIND, "ns", "a"), (KIND, "ns", "b")}  # no gateway yet
        gw = make_gateway({"selector": {"matchLabels": {"team": "x"}}}, namespace="ns")
        await handlers.gateway_event(event={"type": "ADDED"}, body=body(gw, "2"))  # type: ignore[arg-type]
        assert await queued() == {(GATEWAY_KIND, "ns", "gw"), (KIND, "ns", "a")}
        moved = make_gateway({"selector": {"matchLabels": {"team": "y"}}}, namespace="ns")
        await handlers.gateway_event(event={"type": "MODIFIED"}, body=body(moved, "3"))  # type: ignore[arg-type]
        assert await queued() == {(GATEWAY_KIND, "ns", "gw"), (KIND, "ns", "a"), (KIND, "ns", "b")}
        await handlers.resource_event(event={"type": None}, body=rt.cache.get(KIND, "ns", "a"))  # type: ignore[arg-type]
        assert await queued() == {(KIND, "ns", "a"), (GATEWAY_KIND, "ns", "gw")}
        svc = child("Service", "gw", "gw")
        svc["metadata"]["ownerReferences"] = [
            {"kind": GATEWAY_KIND, "name": "gw", "controller": True}
        ]
        handlers.child_seen(KINDS["Service"], "ADDED", svc)
        assert await queued() == {(GATEWAY_KIND, "ns", "gw")}
        await handlers.gateway_event(event={"type": "DELETED"}, body=body(moved, "4"))  # type: ignore[arg-type]
        assert await queued() == {(GATEWAY_KIND, "ns", "gw"), (KIND, "ns", "b")}

    asyncio.run(main())
