"""What Prometheus makes of the chart's monitors: the targets its PodMonitors and
ServiceMonitor make of pods (prometheus-operator's relabelings, then the monitor's own, as
Helm renders the chart), and a scrape of one as Prometheus stores it.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

import toolchain
from testkit.prom import Sample, parse

CHART = Path(__file__).resolve().parents[1] / "charts" / "transcription-operator"
RELEASE, OPERATOR_NAMESPACE = "transcription-operator", "transcription-system"
# Families every Python process exports (prometheus_client's default collectors): not the
# components' own, and left out of the fixtures.
DEFAULT_PREFIXES = ("python_", "process_")


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def relabel(labels: Mapping[str, str], rules: Sequence[Mapping[str, Any]]) -> dict[str, str] | None:
    """Prometheus' relabelling (the actions the chart uses: replace, keep, drop, labeldrop,
    labelkeep), on prometheus-operator's camelCase fields. None: the target (or sample) is
    dropped."""
    out = dict(labels)
    for rule in rules:
        action = rule.get("action", "replace").lower()
        regex = re.compile(f"^(?:{rule.get('regex', '(.*)')})$")
        if action in ("labeldrop", "labelkeep"):
            keep = action == "labelkeep"
            out = {k: v for k, v in out.items() if bool(regex.match(k)) == keep}
            continue
        value = rule.get("separator", ";").join(
            out.get(s, "") for s in rule.get("sourceLabels", [])
        )
        match = regex.match(value)
        if (action == "keep" and not match) or (action == "drop" and match):
            return None
        if action == "replace" and match:
            replacement = str(rule.get("replacement", "$1"))
            result = match.expand(re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", replacement))
            if result:
                out[rule["targetLabel"]] = result
            else:
                out.pop(rule["targetLabel"], None)
        elif action not in ("replace", "keep", "drop"):
            raise ValueError(f"relabel action {action} is not supported here")
    return out


def chart_monitors() -> dict[str, dict[str, Any]]:
    """The chart's monitors as Helm renders them with the monitoring CRDs present, by kind
    and component: `operator` (ServiceMonitor), `frontend` and `worker` (PodMonitors)."""
    out = subprocess.run(
        [str(toolchain.helm()), "template", RELEASE, str(CHART), "-n", OPERATOR_NAMESPACE,
         *monitoring_api_versions(), "--set", "metrics.serviceMonitor.enabled=true",
         "--set", "metrics.podMonitors.enabled=true"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    found: dict[str, dict[str, Any]] = {}
    for doc in yaml.safe_load_all(out.stdout):
        if doc and doc["kind"] == "ServiceMonitor":
            found["operator"] = doc
        elif doc and doc["kind"] == "PodMonitor":
            found[doc["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]] = doc
    return found


def monitoring_api_versions() -> list[str]:
    """`helm template` flags that make the chart see prometheus-operator's CRDs."""
    kinds = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
    return [a for k in kinds for a in ("--api-versions", f"monitoring.coreos.com/v1/{k}")]


@dataclass
class Target:
    """A scrape target: its URL and the labels its samples get."""

    url: str
    labels: dict[str, str]
    metric_relabelings: list[dict[str, Any]] = field(default_factory=list)


def pod_target(
    monitor: Mapping[str, Any], pod: str, namespace: str, pod_labels: Mapping[str, str],
    address: str, container: str,
) -> Target | None:  # fmt: skip
    """The target a PodMonitor makes of a pod: prometheus-operator's own relabelings
    (namespace, container, pod, endpoint, job), then the monitor's."""
    job = f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
    return _target(monitor["spec"]["podMetricsEndpoints"][0], address, namespace, pod, pod_labels,
                   {"__meta_kubernetes_pod_container_name": container},
                   {"container": container, "job": job})  # fmt: skip


def service_target(
    monitor: Mapping[str, Any], service: str, pod: str, namespace: str,
    pod_labels: Mapping[str, str], address: str, container: str,
) -> Target | None:  # fmt: skip
    """The target a ServiceMonitor makes of an endpoint of `service` (the operator's pod)."""
    return _target(monitor["spec"]["endpoints"][0], address, namespace, pod, pod_labels,
                   {"__meta_kubernetes_service_name": service},
                   {"service": service, "container": container, "job": service})  # fmt: skip


def _target(
    ep: Mapping[str, Any], address: str, namespace: str, pod: str, pod_labels: Mapping[str, str],
    discovered: dict[str, str], added: dict[str, str],
) -> Target | None:  # fmt: skip
    """The target of one endpoint of a monitor: what service discovery found of the pod
    (`discovered`: more of its meta labels), the labels prometheus-operator adds (`added`,
    beside namespace, pod and endpoint), then the endpoint's relabelings. None: dropped."""
    meta = {
        "__address__": address,
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": pod,
        **{f"__meta_kubernetes_pod_label_{_sanitize(k)}": v for k, v in pod_labels.items()},
        **discovered,
        "namespace": namespace,
        "pod": pod,
        "endpoint": ep["port"],
        **added,
    }
    labels = relabel(meta, ep.get("relabelings", []))
    if labels is None:
        return None
    labels.setdefault("instance", labels["__address__"])
    labels = {k: v for k, v in labels.items() if not k.startswith("__")}
    url = f"http://{address}{ep.get('path', '/metrics')}"
    return Target(url, labels, list(ep.get("metricRelabelings", [])))


def scrape(target: Target, text: str | None = None, step: int = 0) -> list[Sample]:
    """One scrape as Prometheus stores it: the target's labels on every sample (a sample's
    own label of the same name becomes `exported_<name>`, honor_labels being off), the
    metric relabelings, and `up`. `text`: an exposition already read; None: GET the URL."""
    if text is None:
        try:
            r = httpx.get(target.url, timeout=10)
            r.raise_for_status()
            text = r.text
        except httpx.HTTPError:
            return [Sample("up", tuple(sorted(target.labels.items())), 0.0, step)]
    out = [Sample("up", tuple(sorted(target.labels.items())), 1.0, step)]
    for s in parse(text)[0]:
        if s.name.startswith(DEFAULT_PREFIXES):
            continue
        labels = dict(s.labels)
        for k in set(labels) & set(target.labels):
            labels[f"exported_{k}"] = labels.pop(k)
        labels |= target.labels
        relabelled = relabel({**labels, "__name__": s.name}, target.metric_relabelings)
        if relabelled is not None:
            name = relabelled.pop("__name__")
            out.append(Sample(name, tuple(sorted(relabelled.items())), s.value, step))
    return out


def pods_metric(
    pods: Iterable[Mapping[str, Any]], name: str, *keys: str, port: int = 8080
) -> dict[tuple[str, ...], float]:
    """A metric (a counter, or a gauge) read from each pod's /metrics now, summed over the
    pods by the values of the labels `keys` (no keys: one total under `()`): what the e2e
    suites compare before and after the requests they send."""
    out: dict[tuple[str, ...], float] = {}
    for pod in pods:
        text = httpx.get(f"http://{pod['status']['podIP']}:{port}/metrics", timeout=10).text
        for sample in parse(text)[0]:
            if sample.name == name:
                labels = dict(sample.labels)
                key = tuple(labels.get(k, "") for k in keys)
                out[key] = out.get(key, 0.0) + sample.value
    return out
