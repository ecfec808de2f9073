"""Monitoring: the chart's monitors and alert rules, and the Grafana dashboard, checked with
promtool on series recorded from the real components (tests/fixtures/metrics, written by
`python -m testkit.metrics_record`), and the operator's per-resource series."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

import toolchain
from testkit import monitoring
from testkit.monitoring import ALERTS, Recording, input_series
from testkit.prom import Sample
from testkit.resources import NAME, NAMESPACE
from testkit.scrape import RELEASE, Target, monitoring_api_versions, relabel, scrape
from testkit.tools import built

CHART = monitoring.CHART


@pytest.fixture(scope="module")
def promtool() -> Path:
    return built(toolchain.PROMTOOL, "promtool")


@pytest.fixture(scope="module")
def helm() -> Path:
    return built(toolchain.HELM, "helm")


@pytest.fixture(scope="module")
def recording() -> Recording:
    return Recording.load("local")


def render(*args: str) -> list[dict[str, Any]]:
    helm = built(toolchain.HELM, "helm")
    out = subprocess.run([str(helm), "template", RELEASE, str(CHART), "-n", "transcription-system", *args],
                         check=True, capture_output=True, text=True)  # fmt: skip
    return [d for d in yaml.safe_load_all(out.stdout) if d]


ALL_ON = ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitors.enabled=true",
          "--set", "metrics.prometheusRule.enabled=true"]  # fmt: skip


# --------------------------------------------------------------------------- the chart


def test_chart_renders_monitors_and_rules_where_the_crds_exist() -> None:
    docs = render(*ALL_ON, *monitoring_api_versions())
    kinds = sorted(d["kind"] for d in docs if d["apiVersion"] == "monitoring.coreos.com/v1")
    assert kinds == ["PodMonitor", "PodMonitor", "PrometheusRule", "ServiceMonitor"]
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text()), (
        "the PrometheusRule is files/alerts.yaml"
    )
    workers = next(d for d in docs if d["metadata"]["name"].endswith("-workers"))
    assert workers["spec"]["namespaceSelector"] == {"any": True}
    assert workers["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"


def test_chart_skips_monitors_without_the_crds() -> None:
    """Enabled, but the cluster has no prometheus-operator: nothing of it is rendered (an
    install does not fail on unknown kinds)."""
    docs = render(*ALL_ON)
    assert not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com")]
    assert any(d["kind"] == "Service" and d["metadata"]["name"].endswith("-metrics") for d in docs)


def test_chart_default_has_no_monitors_even_with_the_crds() -> None:
    docs = render(*monitoring_api_versions())
    assert not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com")]


def test_pod_monitors_watch_only_the_watched_namespaces() -> None:
    docs = render(*ALL_ON, *monitoring_api_versions(), "--set", "watchNamespaces={speech,asr}")
    for d in docs:
        if d["kind"] == "PodMonitor":
            assert d["spec"]["namespaceSelector"] == {"matchNames": ["speech", "asr"]}


def test_relabelling_yields_the_labels_of_the_resource_pool_and_engine(helm: Path) -> None:
    """The worker PodMonitor's relabelings, as Prometheus applies them to a worker pod the
    operator created; a transformers worker (no /metrics) is not scraped."""
    from testkit.resources import make_td
    from testkit.scrape import chart_monitors, pod_target
    from transcription_operator.children import build
    from transcription_operator.config import OperatorConfig
    from transcription_operator.plan import plan

    td = make_td({"model": {"name": "openai/whisper-large-v3-turbo"}, "engine": "vllm",
                  "pools": [{"name": "batch", "resources": {"gpus": 1}}]})  # fmt: skip
    deps = [m for m in build(td, OperatorConfig(), plan(td.spec)) if m["kind"] == "Deployment"]
    worker = next(d for d in deps if d["metadata"]["name"] == "whisper-batch")
    labels = worker["spec"]["template"]["metadata"]["labels"]
    monitors = chart_monitors()
    t = pod_target(
        monitors["worker"], "whisper-batch-abc-xyz", "speech", labels, "10.0.0.5:8000", "engine"
    )
    assert t is not None
    assert {k: t.labels[k] for k in ("namespace", "deployment", "pool", "engine", "pod", "job")} == {
        "namespace": "speech", "deployment": "whisper", "pool": "batch", "engine": "vllm",
        "pod": "whisper-batch-abc-xyz", "job": "transcription-worker",
    }  # fmt: skip
    assert "endpoint" not in t.labels
    assert pod_target(monitors["worker"], "p", "speech", {**labels, "transcription.dev/engine": "transformers"},
                      "10.0.0.6:8000", "engine") is None  # fmt: skip
    frontend = next(d for d in deps if d["metadata"]["name"] == "whisper-frontend")
    fe = pod_target(monitors["frontend"], "whisper-frontend-a-b", "speech",
                    frontend["spec"]["template"]["metadata"]["labels"], "10.0.0.7:8080", "frontend")  # fmt: skip
    assert fe is not None and fe.labels["deployment"] == "whisper" and "pool" not in fe.labels


def test_operator_series_get_the_resource_as_namespace_and_deployment(helm: Path) -> None:
    from testkit.scrape import chart_monitors, service_target

    t = service_target(chart_monitors()["operator"], "op-metrics", "op-1", "transcription-system",
                       {}, "10.0.0.9:8080", "operator")  # fmt: skip
    assert t is not None and t.labels["job"] == "transcription-operator"
    text = ('transcription_operator_condition{resource_namespace="speech",resource="whisper",'
            'condition="Ready",reason="Ready"} 1.0\ntranscription_operator_queue_depth 0.0\n')  # fmt: skip
    got = {s.name: dict(s.labels) for s in scrape(t, text)}
    assert got["transcription_operator_condition"]["namespace"] == "speech"
    assert got["transcription_operator_condition"]["deployment"] == "whisper"
    assert "resource" not in got["transcription_operator_condition"]
    assert got["transcription_operator_queue_depth"]["namespace"] == "transcription-system"
    assert got["up"]["job"] == "transcription-operator"


def test_relabel_follows_prometheus() -> None:
    rules = [{"sourceLabels": ["a", "b"], "regex": "(x);(.*)", "targetLabel": "c", "replacement": "${2}-$1"},
             {"action": "labeldrop", "regex": "a"}]  # fmt: skip
    assert relabel({"a": "x", "b": "y"}, rules) == {"b": "y", "c": "y-x"}
    assert relabel({"a": "z"}, [{"action": "keep", "sourceLabels": ["a"], "regex": "x"}]) is None
    # An empty result removes the label, as Prometheus does.
    assert relabel({"a": "", "c": "1"}, [{"sourceLabels": ["a"], "targetLabel": "c"}]) == {"a": ""}


def test_scrape_renames_a_clashing_label() -> None:
    t = Target("http://x", {"job": "j", "pool": "p"})
    samples = scrape(t, 'm_total{pool="q"} 3\n')
    m = next(s for s in samples if s.name == "m_total")
    assert dict(m.labels) == {"job": "j", "pool": "p", "exported_pool": "q"}


# --------------------------------------------------------------------------- recorded series


# The recordings: local processes (always), the test bed's pods once e2e/test_monitoring.py
# has recorded them (RECORD_METRICS=1).
SOURCES = sorted(p.name for p in monitoring.FIXTURES.iterdir() if p.is_dir())


@pytest.mark.parametrize("source", SOURCES)
def test_recorded_series_carry_the_monitors_labels(source: str) -> None:
    """Every worker series names its resource, pool and engine; every frontend series its
    resource; the operator's per-resource series their resource."""
    recording = Recording.load(source)
    want = {
        "namespace": NAMESPACE,
        "deployment": NAME,
        "pool": "cpu",
        "engine": "faster-whisper",
    }
    if source != "local":  # the test bed's namespace is a fresh one, the resource its sample
        want = {"pool": "cpu", "engine": "faster-whisper"}
    for samples in recording.scenarios.values():
        for s in samples:
            labels = dict(s.labels)
            job = labels["job"]
            per_resource = job == "transcription-frontend" or s.name in (
                "transcription_operator_condition", "transcription_operator_pool_replicas")  # fmt: skip
            if job == "transcription-worker":
                assert {"namespace", "deployment"} <= set(labels), s
                assert {k: labels[k] for k in want} == want, s
            elif per_resource:
                assert {"namespace", "deployment"} <= set(labels), s
                if source == "local":
                    assert (labels["namespace"], labels["deployment"]) == (NAMESPACE, NAME), s
            else:
                assert job == "transcription-operator" and "namespace" in labels, s


def test_input_series_sustain_the_recorded_state() -> None:
    types = {"c_total": "counter", "g": "gauge"}
    samples = [
        Sample("c_total", (), 2, 1),
        Sample("c_total", (), 6, 2),
        Sample("g", (), 5, 1),
        Sample("g", (), 3, 2),
    ]
    got = {s["series"]: s["values"] for s in input_series(samples, types, 6)}
    # A counter: 0 before it appeared, then its mean rate over the recording (from 0 at
    # step 0: 3 per step); a gauge: absent before, its last value after.
    assert got == {"c_total": "0 2 6 9+3x2", "g": "_ 5 3 3+0x2"}


# --------------------------------------------------------------------------- alert rules


def test_promtool_checks_the_rule_file(promtool: Path) -> None:
    out = monitoring.run_promtool(promtool, "check", "rules", str(ALERTS))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 7 rules found" in out.stdout, out.stdout


ALERT = {"namespace": NAMESPACE, "deployment": NAME}
CAPABILITIES = ["transcriptions", "transcriptions+segment_timestamps", "transcriptions+stream",
                "transcriptions+word_timestamps"]  # fmt: skip
MODEL = "whisper-tiny.en"
# Scenario -> the alerts that fire (with their labels); every other alert stays silent.
EXPECTED: dict[str, dict[str, list[dict[str, str]]]] = {
    "healthy": {},
    "worker_down": {
        "TranscriptionNoReadyWorker": [{**ALERT, "capability": c, "severity": "critical"} for c in CAPABILITIES],
        "TranscriptionErrorRate": [{**ALERT, "model": MODEL, "severity": "critical"}],
        "TranscriptionHoldTimeouts": [{**ALERT, "pool": "cpu", "severity": "warning"}],
    },
    "saturated": {  # the full queue refused 5 of 8 requests (503): errors too
        "TranscriptionErrorRate": [{**ALERT, "model": MODEL, "severity": "critical"}],
        "TranscriptionQueueSaturated": [{**ALERT, "pool": "cpu", "engine": "faster-whisper", "severity": "warning"}],
    },
    "held": {
        "TranscriptionLatencyHigh": [{**ALERT, "model": MODEL, "severity": "warning"}],
        "TranscriptionHoldTimeouts": [{**ALERT, "pool": "cpu", "severity": "warning"}],
        "TranscriptionErrorRate": [{**ALERT, "model": MODEL, "severity": "critical"}],
    },
    "rollout_stuck": {"TranscriptionRolloutStuck": [{**ALERT, "severity": "warning"}]},
    "secret_missing": {"TranscriptionDegraded": [{**ALERT, "reason": "SecretNotFound", "severity": "warning"}]},
}  # fmt: skip


def alert_names() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_fires_on_a_recorded_bad_state() -> None:
    fired = {a for want in EXPECTED.values() for a in want}
    assert fired == set(alert_names())


def test_alerts_on_the_recorded_scenarios(promtool: Path, recording: Recording) -> None:
    """Each alert fires on the recorded bad state it is about, with exactly these labels,
    and stays silent on the healthy recording and the others."""
    assert set(recording.scenarios) == set(EXPECTED)
    rules = monitoring.rules_without_annotations(yaml.safe_load(ALERTS.read_text()))
    out = monitoring.test_rules(
        promtool, rules, monitoring.alert_tests(recording, EXPECTED, alert_names())
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_wrong_threshold_fails_the_rule_tests(promtool: Path, recording: Recording) -> None:
    """The rule tests can fail: an error-rate alert at 100% stays silent where 5xx are
    fewer (worker_down, where requests were also answered before the worker went)."""
    rules = yaml.safe_load(ALERTS.read_text())
    broken = copy.deepcopy(rules)
    for r in broken["groups"][0]["rules"]:
        if r["alert"] == "TranscriptionErrorRate":
            r["expr"] = r["expr"].replace("> 0.05", "> 1")
    out = monitoring.test_rules(promtool, monitoring.rules_without_annotations(broken),
                                monitoring.alert_tests(recording, EXPECTED, alert_names()))  # fmt: skip
    assert out.returncode != 0 and "TranscriptionErrorRate" in out.stdout + out.stderr


# --------------------------------------------------------------------------- the dashboard


def test_dashboard_queries_name_only_recorded_metrics(recording: Recording) -> None:
    assert monitoring.check_dashboard(monitoring.load_dashboard(), recording, None) == []


def test_other_recordings_hold_what_the_local_one_does(recording: Recording) -> None:
    """The test bed's pods (once recorded) export every series name the local processes did
    in the healthy scenario: the local recording, which the rule tests use, is what the real
    pods say."""
    for source in SOURCES:
        missing = {s.name for s in recording.scenarios["healthy"]} - Recording.load(source).names()
        assert missing == set(), f"{source}: not exported by its components: {sorted(missing)}"


def test_every_dashboard_query_returns_data(promtool: Path, recording: Recording) -> None:
    dashboard = monitoring.load_dashboard()
    assert len(monitoring.queries(dashboard)) >= 30
    assert monitoring.check_dashboard(dashboard, recording, promtool) == []


def test_dashboard_covers_what_operators_ask_for() -> None:
    titles = {p["title"] for p in monitoring.load_dashboard()["panels"]}
    for want in ("Requests by pool and engine", "Latency by pool and engine (p99)", "Queue depth per worker",
                 "In flight per worker", "Audio seconds per second", "Scale events", "Realtime sessions",
                 "Chunked long-audio requests", "Errors by model and status"):  # fmt: skip
        assert want in titles


def test_a_query_of_a_metric_nobody_exports_fails_the_check(recording: Recording) -> None:
    dashboard = monitoring.load_dashboard()
    dashboard["panels"].append({"title": "Typo", "targets": [
        {"refId": "A", "expr": 'sum by (pool) (rate(transcription_frontend_request_total{pool!="x"}[$__rate_interval]))'}]})  # fmt: skip
    problems = monitoring.check_dashboard(dashboard, recording, None)
    assert problems == [
        "panel 'Typo' (A) queries transcription_frontend_request_total, which no component exports "
        "(none in the recorded series): " + dashboard["panels"][-1]["targets"][0]["expr"]
    ]


def test_a_query_without_data_fails_the_check(promtool: Path, recording: Recording) -> None:
    """A recorded metric with a label value nobody has: no data, named by panel."""
    dashboard = {"panels": [{"title": "Nothing", "targets": [
        {"refId": "B", "expr": 'sum(transcription_frontend_requests_total{status="418"})'}]}]}  # fmt: skip
    problems = monitoring.check_dashboard(dashboard, recording, promtool)
    assert problems == ["panel 'Nothing' (B) returns no data on the recorded series: "
                        'sum(transcription_frontend_requests_total{status="418"})']  # fmt: skip


def test_metric_names_of_promql() -> None:
    expr = ('histogram_quantile(0.99, sum by (pool, le) (rate(a_bucket{x="y z", le!="1"}[5m]) '
            '* on (namespace, pool) group_left (engine) max by (pool) (vllm:b))) > 2 and c offset 5m')  # fmt: skip
    assert monitoring.metric_names(expr) == {"a_bucket", "vllm:b", "c"}


# --------------------------------------------------------------------------- the operator


def test_operator_reports_conditions_pools_and_capabilities() -> None:
    """The reconciler's per-resource series: replaced as the status changes, gone with the
    resource."""
    from prometheus_client import REGISTRY

    from testkit.operator import World, deployment
    from transcription_operator import metrics

    spec = {"model": {"name": "whisper-tiny.en"}, "engine": "faster-whisper",
            "pools": [{"name": "cpu", "replicas": 2}], "traffic": {"features": ["word_timestamps"]},
            "frontend": {"replicas": 1}}  # fmt: skip
    world = World(spec)
    world.reconcile()

    def value(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(
            name, {"resource_namespace": "speech", "resource": "whisper", **labels}
        )

    assert (
        value(
            "transcription_operator_pool_replicas",
            pool="cpu",
            engine="faster-whisper",
            state="desired",
        )
        == 2
    )
    assert (
        value(
            "transcription_operator_pool_replicas",
            pool="cpu",
            engine="faster-whisper",
            state="ready",
        )
        == 0
    )
    assert value("transcription_operator_capability_workers", capability="transcriptions+word_timestamps",
                 state="ready") == 0  # fmt: skip
    reason = world.condition("Ready")["reason"]
    assert value("transcription_operator_condition", condition="Ready", reason=reason) == 0
    for name, replicas in (("whisper-cpu", 2), ("whisper-frontend", 1)):  # all ready
        meta = world.kube.objects[("Deployment", name)]["metadata"]
        world.observe({**deployment(name, replicas, replicas), "kind": "Deployment", "apiVersion": "apps/v1",
                       "metadata": {**meta, "generation": 1}})  # fmt: skip
    world.reconcile()
    assert value("transcription_operator_capability_workers", capability="transcriptions",
                 state="ready") == 2  # fmt: skip
    assert value("transcription_operator_condition", condition="Ready", reason="Ready") == 1
    assert (
        value("transcription_operator_condition", condition="Ready", reason=reason) is None
    )  # replaced
    world.cache.drop("TranscriptionDeployment", "speech", "whisper")
    world.reconcile()  # gone
    assert value("transcription_operator_condition", condition="Ready", reason="Ready") is None
    metrics.forget_all()


MONITORED = {"model": {"name": "openai/whisper-large-v3-turbo"}, "engine": "vllm",
             "pools": [{"name": "batch", "resources": {"gpus": 1}},
                       {"name": "chat", "engine": "transformers", "mode": "sequential"}],
             "monitoring": {"podMonitor": True, "interval": "15s", "labels": {"release": "kps"}}}  # fmt: skip


def test_the_operator_creates_a_pod_monitor_when_the_spec_asks() -> None:
    """spec.monitoring.podMonitor: one PodMonitor for the resource's frontend and workers,
    relabelled as the chart's monitors are (Prometheus' relabelling on the pods' labels)."""
    from testkit.resources import make_td
    from testkit.scrape import pod_target
    from transcription_operator.children import build
    from transcription_operator.config import OperatorConfig

    assert not [m for m in build(make_td({**MONITORED, "monitoring": {}}), OperatorConfig())
                if m["kind"] == "PodMonitor"]  # fmt: skip
    children = build(make_td(MONITORED), OperatorConfig())
    (monitor,) = [m for m in children if m["kind"] == "PodMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["podMetricsEndpoints"][0]["interval"] == "15s"
    assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "whisper"
    pods = {m["metadata"]["name"]: m["spec"]["template"]["metadata"]["labels"]
            for m in children if m["kind"] == "Deployment"}  # fmt: skip
    want = {
        "whisper-batch": ("transcription-worker", "batch", "vllm"),
        "whisper-frontend": ("transcription-frontend", None, None),
    }
    for name, (job, pool, engine) in want.items():
        t = pod_target(monitor, f"{name}-a-b", "speech", pods[name], "10.0.0.5:8000", "c")
        assert t is not None
        assert (t.labels["job"], t.labels["deployment"], t.labels.get("pool"), t.labels.get("engine")) == (
            job, "whisper", pool, engine)  # fmt: skip
        assert "endpoint" not in t.labels
    assert (
        pod_target(monitor, "p", "speech", pods["whisper-chat"], "10.0.0.6:8000", "c") is None
    )  # no /metrics


def test_a_pod_monitor_is_skipped_where_prometheus_operator_is_missing() -> None:
    """The cluster does not serve PodMonitors: the rest is applied, and the resource is not
    Degraded for it (unlike a missing KEDA for an autoscaled pool)."""
    from testkit.operator import World

    world = World({**MONITORED, "pools": MONITORED["pools"][:1]})
    world.kube.unserved.add("PodMonitor")
    world.reconcile()
    assert ("apply", "PodMonitor", "whisper-metrics") in world.kube.writes
    assert ("Deployment", "whisper-batch") in world.kube.objects
    assert world.condition("Degraded")["status"] == "False"
    world.kube.unserved.clear()
    world.reconcile()
    assert ("PodMonitor", "whisper-metrics") in world.kube.objects
