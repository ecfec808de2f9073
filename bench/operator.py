"""Operator benchmark on the test bed: create N resources (N = 1, 50, 200) at once and
measure the time until all are Ready, the API requests per reconcile, and the operator's
CPU time and peak memory."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from .common import PY, ROOT, Proc, say, table, write

sys.path.insert(0, str(ROOT / "e2e"))
import testbed

METRICS, HEALTH = 18760, 18761


def resource(i: int) -> dict[str, Any]:
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
            "pools": [{"name": "cpu", "replicas": 1}],
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


def ready_count(ns: str) -> int:
    items = json.loads(testbed.kubectl("get", "tdeploy", "-n", ns, "-o", "json"))["items"]
    n = 0
    for td in items:
        st = td.get("status") or {}
        if st.get("observedGeneration") == td["metadata"]["generation"] and any(
            c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions", [])
        ):
            n += 1
    return n


def measure(op: Proc, n: int) -> dict[str, Any]:
    ns = f"bench-{n}"
    # Simulated pods (KWOK): hundreds of them, which the real node could not run.
    testbed.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "annotations": testbed.SIMULATED_NAMESPACE_ANNOTATIONS}}))  # fmt: skip
    before, cpu0 = metrics(METRICS), op.cpu_seconds()
    op.reset_peak()
    start = time.monotonic()
    items = {"apiVersion": "v1", "kind": "List", "items": [resource(i) for i in range(n)]}
    testbed.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(items))
    ready, last = 0, -1
    while ready < n:
        if time.monotonic() - start > 900:
            raise SystemExit(f"only {ready}/{n} Ready after 15 minutes")
        time.sleep(0.5)
        ready = ready_count(ns)
        if ready != last:
            say(f"    N={n}: {ready}/{n} Ready after {time.monotonic() - start:.1f}s")
            last = ready
    elapsed = time.monotonic() - start
    time.sleep(2)  # let the last status writes land
    after = metrics(METRICS)
    reconciles = total(after, "transcription_operator_reconciles_total") - total(
        before, "transcription_operator_reconciles_total"
    )
    requests = total(after, "transcription_operator_api_requests_total") - total(
        before, "transcription_operator_api_requests_total"
    )
    writes = requests - (after.get('transcription_operator_api_requests_total{verb="GET"}', 0)
                         - before.get('transcription_operator_api_requests_total{verb="GET"}', 0))  # fmt: skip
    result = {
        "resources": n,
        "seconds_to_all_ready": elapsed,
        "reconciles": reconciles,
        "api_requests": requests,
        "api_requests_per_reconcile": requests / reconciles if reconciles else 0.0,
        "api_writes_per_resource": writes / n,
        "operator_cpu_seconds": op.cpu_seconds() - cpu0,
        "operator_peak_rss_mib": op.peak_kib() / 1024,
    }
    testbed.kubectl("delete", "namespace", ns, "--wait=false")
    return result


def run(quick: bool = False) -> dict[str, Any]:
    sizes = [1, 10] if quick else [1, 50, 200]
    was_up = testbed.is_up()
    testbed.up()
    testbed.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        str(ROOT / "crds" / "transcriptiondeployments.transcription.dev.yaml"),
    )
    testbed.kubectl(
        "wait", "--for=condition=Established", "crd/transcriptiondeployments.transcription.dev"
    )
    op = Proc([PY, "-m", "transcription_operator.main", "--kubeconfig", str(testbed.KUBECONFIG),
               "--metrics-port", str(METRICS), "--health-port", str(HEALTH), "--log-level", "WARNING"],
              f"http://127.0.0.1:{HEALTH}/healthz", "operator")  # fmt: skip
    rows = []
    try:
        for n in sizes:
            say(f"creating {n} TranscriptionDeployments")
            rows.append(measure(op, n))
    finally:
        op.stop()
        if not was_up:
            testbed.down()
    table("Operator on the test bed (each resource: 1 worker + 1 frontend pod, 10 children)",
          ["N", "s to all Ready", "reconciles", "API req/reconcile", "writes/resource", "CPU s", "peak RSS MiB"],
          [[r["resources"], r["seconds_to_all_ready"], r["reconciles"], r["api_requests_per_reconcile"],
            r["api_writes_per_resource"], r["operator_cpu_seconds"], r["operator_peak_rss_mib"]] for r in rows])  # fmt: skip
    result = {"runs": rows}
    write("operator", result)
    return result
