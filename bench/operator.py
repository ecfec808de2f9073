"""Operator benchmark on the test bed: create N resources (N = 1, 50, 200) at once and
measure the time until all are Ready, the API requests per reconcile, and the operator's
CPU time and peak memory.

Then a quiet window: nothing changes but what the cluster itself does (the scheduler
retrying pods it cannot place, the kubelet's status and Events). The operator reads pods
and their Events from its watch cache, never per pod, so its API request rate in that
window stays at zero whatever N is -- also for resources that are *not* Ready: the second
scenario gives each resource a pool no node can hold (Unschedulable, which status reports
with the scheduler's message) and measures the same window."""

from __future__ import annotations

import json
import time
from typing import Any

import testbed.cluster

from .common import PY, ROOT, Proc, say, table, write

METRICS, HEALTH = 18760, 18761
QUIET_SECONDS = 30.0


def resource(i: int, unschedulable: bool = False) -> dict[str, Any]:
    pool: dict[str, Any] = {"name": "cpu", "replicas": 1}
    if unschedulable:  # more GPUs than any test bed node has (6 divides tiny's 6 heads)
        pool = {"name": "huge", "engine": "vllm", "replicas": 1, "resources": {"gpus": 6}}
    return {
        "apiVersion": "transcription.dev/v1alpha1",
        "kind": "TranscriptionDeployment",
        "metadata": {"name": f"asr-{i}"},
        "spec": {
            "model": {
                "name": "whisper-tiny.en",
                "aliases": ["whisper-1"],
                "source": "image",
                "path": "/models/tiny",
            },
            "engine": "faster-whisper",
            "pools": [pool],
            "frontend": {"replicas": 1, "resources": {}},
        },
    }


def metrics(port: int) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("transcription_operator_") and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def total(m: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in m.items() if k.startswith(prefix))


def ready_count(ns: str, reason: str = "Ready") -> int:
    """Resources settled where they can: Ready's reason (for the current generation) is
    this one, and the frontend is ready (an Unschedulable pool's frontend still starts:
    until it is ready, its status has more to say)."""
    items = json.loads(testbed.cluster.kubectl("get", "tdeploy", "-n", ns, "-o", "json"))["items"]
    n = 0
    for td in items:
        st = td.get("status") or {}
        if (
            st.get("observedGeneration") == td["metadata"]["generation"]
            and any(
                c["type"] == "Ready" and c["reason"] == reason for c in st.get("conditions", [])
            )
            and (st.get("frontend") or {}).get("readyReplicas")
            == td["spec"]["frontend"]["replicas"]
        ):
            n += 1
    return n


def by_label(
    before: dict[str, float], after: dict[str, float], metric: str, label: str
) -> dict[str, float]:
    """How much each series of a counter grew, by one label's value (those that grew)."""
    out = {}
    for k, v in after.items():
        if k.startswith(metric + "{") and f'{label}="' in k and v - before.get(k, 0.0):
            out[k.split(f'{label}="', 1)[1].split('"', 1)[0]] = v - before.get(k, 0.0)
    return out


def idle(seconds: float = 3.0, timeout: float = 180.0) -> None:
    """Until the operator has reconciled nothing for `seconds`: what the last scenario's
    teardown queued (hundreds of deletions) is done before the next measurement starts."""
    deadline = time.monotonic() + timeout
    last, since = -1.0, time.monotonic()
    while time.monotonic() < deadline:
        now = total(metrics(METRICS), "transcription_operator_reconciles_total")
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return
        time.sleep(0.5)
    raise SystemExit(f"the operator kept reconciling for {timeout:.0f}s with nothing changing")


def quiet(op: Proc) -> dict[str, Any]:
    """API requests, reconciles (and what asked for them) and status writes (and what they
    changed, from the operator's log) while nobody changes anything."""
    before, logged = metrics(METRICS), op.log_size()
    time.sleep(QUIET_SECONDS)
    after = metrics(METRICS)
    changed: dict[str, int] = {}
    for line in op.log_since(logged).splitlines():
        if " changed" in line and ": status of " in line:
            for path in line.split(": ", 2)[-1].removesuffix(" changed").split(", "):
                changed[path] = changed.get(path, 0) + 1

    def delta(prefix: str) -> float:
        return total(after, prefix) - total(before, prefix)

    return {
        "quiet_reconciles_asked_by": by_label(
            before, after, "transcription_operator_enqueued_total", "by"
        ),
        "quiet_status_changes": changed,
        "quiet_api_requests_per_s": delta("transcription_operator_api_requests_total")
        / QUIET_SECONDS,
        "quiet_reconciles_per_s": delta("transcription_operator_reconciles_total") / QUIET_SECONDS,
        # Which requests, if any: GET (reads, lists) or writes, by verb.
        "quiet_api_requests_by_verb": by_label(
            before, after, "transcription_operator_api_requests_total", "verb"
        ),
        "pods_watched": after.get('transcription_operator_managed_resources{kind="Pod"}', 0.0),
        "events_watched": after.get('transcription_operator_managed_resources{kind="Event"}', 0.0),
    }


def measure(op: Proc, n: int, unschedulable: bool = False) -> dict[str, Any]:
    ns = f"bench-{n}" + ("-unschedulable" if unschedulable else "")
    want = "Unschedulable" if unschedulable else "Ready"
    # Simulated pods (KWOK): hundreds of them, which the real node could not run.
    testbed.cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "annotations": testbed.cluster.SIMULATED_NAMESPACE_ANNOTATIONS}}))  # fmt: skip
    idle()
    before, cpu0 = metrics(METRICS), op.cpu_seconds()
    op.reset_peak()
    start = time.monotonic()
    items = {"apiVersion": "v1", "kind": "List",
             "items": [resource(i, unschedulable) for i in range(n)]}  # fmt: skip
    testbed.cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(items))
    ready, last = 0, -1
    while ready < n:
        if time.monotonic() - start > 900:
            raise SystemExit(f"only {ready}/{n} {want} after 15 minutes")
        time.sleep(0.5)
        ready = ready_count(ns, want)
        if ready != last:
            say(f"    N={n}: {ready}/{n} {want} after {time.monotonic() - start:.1f}s")
            last = ready
    elapsed = time.monotonic() - start
    idle()  # the last status writes and their echoes
    after = metrics(METRICS)
    reconciles = total(after, "transcription_operator_reconciles_total") - total(
        before, "transcription_operator_reconciles_total"
    )
    requests = total(after, "transcription_operator_api_requests_total") - total(
        before, "transcription_operator_api_requests_total"
    )
    writes = requests - (after.get('transcription_operator_api_requests_total{verb="GET"}', 0)
                         - before.get('transcription_operator_api_requests_total{verb="GET"}', 0))  # fmt: skip
    say(f"    N={n}: quiet window of {QUIET_SECONDS:.0f}s")
    calm = quiet(op)
    say(
        f"    N={n}: quiet window requests by verb: {calm['quiet_api_requests_by_verb'] or 'none'}; "
        f"reconciles asked by: {calm['quiet_reconciles_asked_by'] or 'nothing'}; "
        f"status changes: {calm['quiet_status_changes'] or 'none'}"
    )
    result = {
        "scenario": want,
        "resources": n,
        "seconds_to_all_ready": elapsed,
        "reconciles": reconciles,
        "api_requests": requests,
        "api_requests_per_reconcile": requests / reconciles if reconciles else 0.0,
        "api_writes_per_resource": writes / n,
        "operator_cpu_seconds": op.cpu_seconds() - cpu0,
        "operator_peak_rss_mib": op.peak_kib() / 1024,
        **calm,
    }
    # Gone before the next scenario: its teardown must not fall into that quiet window.
    testbed.cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=600s")
    return result


def run(quick: bool = False) -> dict[str, Any]:
    sizes = [1, 10] if quick else [1, 50, 200]
    was_up = testbed.cluster.is_up()
    testbed.cluster.up()
    testbed.cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        str(ROOT / "crds" / "transcriptiondeployments.transcription.dev.yaml"),
    )
    testbed.cluster.kubectl(
        "wait", "--for=condition=Established", "crd/transcriptiondeployments.transcription.dev"
    )
    op = Proc([PY, "-m", "transcription_operator.main", "--kubeconfig", str(testbed.cluster.KUBECONFIG),
               "--metrics-port", str(METRICS), "--health-port", str(HEALTH), "--log-level", "INFO"],
              f"http://127.0.0.1:{HEALTH}/healthz", "operator")  # fmt: skip
    rows = []
    try:
        for n in sizes:
            say(f"creating {n} TranscriptionDeployments")
            rows.append(measure(op, n))
        for n in sizes[:2]:
            say(f"creating {n} TranscriptionDeployments whose pool no node can hold")
            rows.append(measure(op, n, unschedulable=True))
    finally:
        op.stop()
        if not was_up:
            testbed.cluster.down()
    table("Operator on the test bed (each resource: 1 worker + 1 frontend pod, 10 children)",
          ["scenario", "N", "s to status", "reconciles", "API req/reconcile", "writes/resource", "CPU s",
           "peak RSS MiB", "pods watched", "quiet reconciles/s", "quiet API req/s"],
          [[r["scenario"], r["resources"], r["seconds_to_all_ready"], r["reconciles"], r["api_requests_per_reconcile"],
            r["api_writes_per_resource"], r["operator_cpu_seconds"], r["operator_peak_rss_mib"], r["pods_watched"],
            r["quiet_reconciles_per_s"], r["quiet_api_requests_per_s"]] for r in rows])  # fmt: skip
    result = {"runs": rows}
    write("operator", result)
    # Nothing changes in the quiet window: the operator writes nothing and asks nothing.
    noisy = [f"{r['scenario']} N={r['resources']}: {r['quiet_api_requests_by_verb']}, status "
             f"changes {r['quiet_status_changes']}" for r in rows if r["quiet_api_requests_by_verb"]]  # fmt: skip
    if noisy:
        raise SystemExit("API requests in a quiet window (expected none): " + "; ".join(noisy))
    return result
