"""The frontend's settings: one model from the resource to the gateway. The operator builds
them, they travel as JSON in one environment variable, the frontend reads them once, and
each reaches the part of the gateway that uses it."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from testkit.resources import make_td
from testkit.standins import free_port
from transcription_api.frontend import (
    SETTINGS_ENV,
    Balancer,
    ChunkingSpec,
    Discovery,
    FrontendSettings,
    HoldLimits,
    SettingsError,
    TenantQuota,
    TenantSpec,
    WorkerTimeouts,
)
from transcription_api.routes import RouteTable
from transcription_api.v1alpha1 import FrontendSpec
from transcription_frontend import heap
from transcription_frontend import main as frontend_main
from transcription_frontend.app import create_app
from transcription_frontend.main import config_of, gateway_of, load_settings, main
from transcription_operator.children import build
from transcription_operator.children.frontend import frontend_settings
from transcription_operator.config import OperatorConfig

TABLE = RouteTable(model="m", namespace="from-the-table", pools=[])
RESOURCE = {
    "model": {"name": "m"},
    "pools": [{"name": "batch", "autoscaling": {"maxReplicas": 3}}],
    "frontend": {
        "maxAudioSeconds": 7200,
        "apiKeySecret": {"name": "keys", "key": "keys.txt"},
        "chunking": {"enabled": False, "thresholdSeconds": 300, "maxChunkSeconds": 20,
                     "maxParallelChunks": 2, "previousText": True},
        "limits": {"maxHeaderBytes": 4096, "maxHeaders": 20, "headerTimeoutSeconds": 2.5,
                   "bodyTimeoutSeconds": 7, "bodyMinBytesPerSecond": 10, "idleTimeoutSeconds": 9,
                   "maxBodyBytes": 123456, "maxConcurrency": 5, "maxConnections": 50,
                   "maxConnectionsPerClient": 10, "drainSeconds": 4, "drainMaxBytes": 65536,
                   "maxRealtimeSessions": 3, "realtimeSessionSeconds": 60,
                   "realtimeIdleTimeoutSeconds": 5, "realtimeMaxAppendBytes": 4096},
    },
}  # fmt: skip


def env_of_frontend(spec: dict[str, Any]) -> dict[str, str]:
    for m in build(make_td(spec), OperatorConfig()):
        if m["kind"] == "Deployment" and m["metadata"]["name"] == "whisper-frontend":
            container = m["spec"]["template"]["spec"]["containers"][0]
            assert container["args"] == ["--routes", "/etc/transcription/routes.json"]
            return {e["name"]: e["value"] for e in container["env"] if "value" in e}
    raise AssertionError("no frontend Deployment")


def test_what_the_operator_builds_is_what_the_frontend_reads() -> None:
    """The resource's spec.frontend, through the pod's environment, into the frontend."""
    env = env_of_frontend(RESOURCE)
    read = load_settings(None, env)
    td = make_td(RESOURCE)
    assert read == frontend_settings(td, scaler=True)
    fe = td.spec.frontend
    assert (read.limits, read.chunking, read.max_audio_seconds) == (
        fe.limits, fe.chunking, fe.max_audio_seconds)  # fmt: skip
    assert read.limits.realtime_idle_timeout_seconds == 5  # one name, end to end
    assert read.discovery == Discovery.KUBERNETES
    assert read.peers_service == "whisper"  # autoscaled: the scaler sums its peers' load
    assert read.api_keys_path == Path("/etc/transcription/api-keys/keys.txt")
    # An unchanged resource: the settings carry only the pod's wiring.
    plain = env_of_frontend({"model": {"name": "m"}})
    assert json.loads(plain[SETTINGS_ENV]) == {"discovery": "kubernetes"}
    # Tenants: their quotas are shared among the replicas, which the frontend learns from
    # its peers, autoscaled pools or not.
    tenants = [{"name": "calls", "quota": {"audioSecondsPerMinute": 600}, "weight": 3}]
    with_tenants = env_of_frontend({"model": {"name": "m"}, "frontend": {"tenants": tenants}})
    read = load_settings(None, with_tenants)
    assert read.peers_service == "whisper"
    assert read.tenants == [TenantSpec(name="calls", weight=3,
                                       quota=TenantQuota(audio_seconds_per_minute=600))]  # fmt: skip


def test_the_defaults_are_the_resources() -> None:
    """Limits and chunking are the resource's own models: the same defaults, and no list of
    fields kept in step by hand."""
    spec, settings = FrontendSpec(), FrontendSettings()
    assert settings.limits == spec.limits and settings.chunking == spec.chunking
    assert settings.max_audio_seconds == spec.max_audio_seconds
    assert settings.tenants == spec.tenants == []
    for name in ("limits", "chunking", "max_audio_seconds", "tenants"):
        assert (
            FrontendSettings.model_fields[name].annotation
            == FrontendSpec.model_fields[name].annotation
        )
        assert (
            FrontendSettings.model_fields[name].metadata == FrontendSpec.model_fields[name].metadata
        )
    # Without the variable or a file (a developer's `--routes routes.json`): every default.
    assert load_settings(None, {}) == load_settings(None, {SETTINGS_ENV: " "}) == settings


def every_setting_changed(tmp_path: Path) -> FrontendSettings:
    return FrontendSettings(
        host="127.0.0.1", port=free_port(), scaler_port=free_port(), internal_port=free_port(),
        discovery=Discovery.KUBERNETES, namespace="speech", peers_service="whisper",
        balancer=Balancer.ROUND_ROBIN, api_keys_path=tmp_path / "keys", api_docs=True,
        shutdown_grace_seconds=7, max_audio_seconds=600,
        limits=make_td(RESOURCE).spec.frontend.limits,
        chunking=ChunkingSpec(enabled=False, max_parallel_chunks=2),
        hold=HoldLimits(max_requests=3, max_bytes=4096, max_memory_bytes=2048, timeout_seconds=9),
        worker_timeouts=WorkerTimeouts(connect_seconds=1.5, read_seconds=60),
        tenants=[TenantSpec(name="drafts", quota=TenantQuota(audio_seconds_per_minute=60))],
    )  # fmt: skip


def test_every_setting_reaches_the_part_of_the_gateway_that_uses_it(tmp_path: Path) -> None:
    settings = every_setting_changed(tmp_path)
    defaults = FrontendSettings()
    assert all(getattr(settings, f) != getattr(defaults, f) for f in FrontendSettings.model_fields)
    env = {SETTINGS_ENV: settings.to_env(), "POD_NAMESPACE": "the-pods"}
    read = load_settings(None, env)
    assert read == settings
    gateway = gateway_of(read, TABLE, tmp_path / "routes.json", None, env)
    app = create_app(gateway)
    config = config_of(read, app, "info")
    limits = read.limits
    running = asyncio.run(_running(read))
    charge = gateway.quotas.admit(read.tenants[0], 1)
    guard: Any = app.app  # type: ignore[attr-defined]  # request ids, the Guard
    uses: dict[str, list[tuple[Any, Any]]] = {
        "host": [(config.host, "127.0.0.1")],
        "port": [(config.port, read.port)],
        "scaler_port": [(running["scaler"], True)],
        "internal_port": [
            (running["internal"], True),
            (gateway.load.peers.port, read.internal_port),
        ],
        "discovery": [(gateway.slice_namespace, "speech")],
        "namespace": [(gateway.slice_namespace, "speech")],
        "peers_service": [(gateway.slices.peers_service, "whisper")],
        "balancer": [(gateway.router.policy, "round-robin")],
        "api_keys_path": [(gateway.keys.path, tmp_path / "keys")],
        "api_docs": [(guard.app.app.docs_url, "/docs"), (guard.app.app.redoc_url, "/redoc")],
        "shutdown_grace_seconds": [(config.timeout_graceful_shutdown, 7)],
        "max_audio_seconds": [(gateway.settings.max_audio_seconds, 600)],  # the pipeline's check
        "limits": [
            (config.http.limits, limits),  # type: ignore[union-attr]
            (config.timeout_keep_alive, limits.idle_timeout_seconds),
            (config.limit_concurrency, None),  # the protocol counts connections, not uvicorn
            (config.ws_max_size, 4096 * 8 // 3 + 64 * 1024),
            (guard.limits, limits),
            (gateway.sessions.limits, limits),  # realtime
        ],
        "chunking": [(gateway.settings.chunking, read.chunking)],  # the pipeline's plan
        "hold": [(gateway.holds.limits, read.hold)],
        "worker_timeouts": [(running["timeouts"], (1.5, 60))],
        "tenants": [  # the keys' tenants, and their quotas
            (list(gateway.tenants.specs.values()), read.tenants),
            (charge.standing.limit if charge else None, 60),
        ],
    }
    assert set(uses) == set(FrontendSettings.model_fields)  # a new setting needs its line here
    for name, pairs in uses.items():
        for got, want in pairs:
            assert got == want, name
    # Static discovery watches no EndpointSlices, whatever the namespace.
    static = read.model_copy(update={"discovery": Discovery.STATIC})
    assert gateway_of(static, TABLE, tmp_path / "r.json", None, env).slice_namespace is None
    # No namespace set: the pod's, else the route table's.
    unset = read.model_copy(update={"namespace": None})
    assert gateway_of(unset, TABLE, tmp_path / "r.json", None, env).slice_namespace == "the-pods"
    assert (
        gateway_of(unset, TABLE, tmp_path / "r.json", None, {}).slice_namespace == "from-the-table"
    )


async def _running(settings: FrontendSettings) -> dict[str, Any]:
    """What a running gateway serves: its scaler's and its load report's ports, its worker
    client's timeouts."""
    from transcription_frontend.gateway import Gateway
    from transcription_frontend.routing import Router

    gateway = Gateway(Router(TABLE), settings=settings)  # no slice_namespace: no watch
    async with gateway.running():
        assert gateway.client is not None
        timeout = gateway.client.timeout
        return {
            "scaler": _listening(settings.scaler_port),
            "internal": _listening(settings.internal_port),
            "timeouts": (timeout.connect, timeout.sock_read),
        }


def _listening(port: int | None) -> bool:
    assert port is not None
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize(
    ("raw", "named"),
    [('{"limits": {"max_headers": 2}}', "limits.max_headers: Input should be greater than or equal to 8 (got 2)"),
     ('{"limits": {"max_header": 2048}}', "unknown field 'limits.max_header'"),
     ('{"hold_timeout": 5}', "unknown field 'hold_timeout'"),
     ('{"discovery": "dns"}', "discovery: Input should be 'static' or 'kubernetes' (got \"dns\")"),
     ('{"port": 8080', "not JSON"),
     ('["--port", "8080"]', "the settings: Input should be an object")],
)  # fmt: skip
def test_malformed_settings_get_one_clear_error_naming_the_field(raw: str, named: str) -> None:
    with pytest.raises(SettingsError) as e:
        FrontendSettings.from_env({SETTINGS_ENV: raw})
    message = str(e.value)
    assert message.startswith(f"{SETTINGS_ENV} is not valid frontend settings: ")
    assert named in message
    assert "fix it, or leave it out for every default" in message  # what to do


def test_the_frontend_refuses_to_start_on_bad_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    routes = tmp_path / "routes.json"
    routes.write_text(TABLE.dumps())
    monkeypatch.setenv(SETTINGS_ENV, '{"limits": {"maxConcurrency": 0}}')
    assert main(["--routes", str(routes)]) == 2
    assert (
        "limits.maxConcurrency: Input should be greater than or equal to 1"
        in capsys.readouterr().err
    )
    # --settings FILE: it, not the variable; a bad one named by its path.
    bad = tmp_path / "frontend.json"
    bad.write_text('{"limitz": {}}')
    assert main(["--routes", str(routes), "--settings", str(bad)]) == 2
    assert (
        f"{bad} is not valid frontend settings: unknown field 'limitz'" in capsys.readouterr().err
    )
    assert main(["--routes", str(routes), "--settings", str(tmp_path / "none.json")]) == 2
    assert "cannot read the frontend settings" in capsys.readouterr().err


def test_a_settings_file_replaces_the_variable(tmp_path: Path) -> None:
    path = tmp_path / "frontend.json"
    path.write_text(FrontendSettings(port=8081, scaler_port=None).model_dump_json())
    got = load_settings(path, {SETTINGS_ENV: '{"port": 9000}'})
    assert (got.port, got.scaler_port) == (8081, None)


def test_the_frontend_imports_nothing_of_the_resources_version_module() -> None:
    """The frontend's contract is its settings: the CRD's version module (and the CRD
    generator) stay the operator's."""
    import ast

    package = Path(__file__).resolve().parents[1] / "frontend_image" / "transcription_frontend"
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [f"{node.module}.{a.name}" for a in node.names]
                if isinstance(node, ast.ImportFrom) else []
            )  # fmt: skip
            for name in names:
                assert not name.startswith(
                    ("transcription_api.v1alpha1", "transcription_api.crd")
                ), path


def test_the_frontend_holds_glibcs_heap_steady_before_anything_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """main fixes glibc's mmap threshold first (transcription_frontend.heap: left to adjust,
    an hour's VAD pass grew the heap by 230-320 MB in about one run of ten), even on a start
    that fails on its settings."""
    calls: list[str] = []

    def hold_steady() -> bool:
        calls.append("held")
        return True

    monkeypatch.setattr(frontend_main, "hold_steady", hold_steady)
    monkeypatch.setenv(SETTINGS_ENV, '{"limits": {"maxConcurrency": 0}}')
    assert main(["--routes", str(tmp_path / "none.json")]) == 2
    assert calls == ["held"]
    assert heap.hold_steady()  # glibc here, as in the images: mallopt takes the setting
