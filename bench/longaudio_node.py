"""The long-audio benchmark (bench/longaudio.py) on the test bed's real node, as issue 21
asks: the chart's operator in the cluster, the CPU sample (faster-whisper workers, Whisper
tiny.en, 1 thread each: `resources.cpu: 500m`, an equal share per replica), one frontend
pod, every request with the OpenAI SDK through the frontend's Service (cluster IP,
kube-proxy) from this machine.

Two phases on one resource:
1. one worker replica, `spec.frontend.chunking.enabled: false`:
   (a) the whole file, no `chunking_strategy`: decoded whole by the one replica;
   (c) the same with `chunking_strategy="auto"` (chunked either way): chunking's own cost;
2. chunking on (the operator rolls the frontend), then two worker replicas:
   (b) `chunking_strategy="auto"` across both; the same streamed (first delta);
   short requests (a 3-5 s sentence, one started every second) alone, then beside (b);
3. `maxParallelChunks: 1` (one chunk of the request at a time, so one pod stays free of
   chunks): the long request again, beside short requests.
Each pod's CPU seconds come from its cgroup (cpuacct) on this machine. The WER reference is
faster-whisper itself on the whole file, in this process (bench/longaudio.py's `bare`).
The frontend-memory row stays bench/longaudio.py's (a local process whose RSS it reads).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import testbed.cluster
from testbed.kube import CRD_FILE, SAMPLES, wait_for
from testbed.kubectl import Kubectl
from testbed.operators import deployed_on_the_real_node

from .common import RESULTS, say, table, write
from .longaudio import (
    SHORT_BASELINE,
    beside_long,
    material,
    one_replica,
    reported,
    short_rows,
    shorts,
    streamed,
    targets_table,
    verdict,
)

NAME = "whisper-cpu"
RELEASE = "bench-longaudio-operator"
WORKER_CPU = "500m"  # 1 thread each; two fit beside the frontend (and its surge pod) and the operator on 2 cores
WHERE = "through the Service on the test bed's real node"


class PodCPU:
    """A pod's CPU seconds, from its cgroup (cgroups v1, the kubelet's cgroupfs driver)."""

    def __init__(self, pod: dict[str, Any]) -> None:
        self.uid = uid = pod["metadata"]["uid"]
        qos = pod["status"].get("qosClass", "Burstable").lower()
        base = Path("/sys/fs/cgroup/cpuacct/kubepods")
        self.usage = (base if qos == "guaranteed" else base / qos) / f"pod{uid}" / "cpuacct.usage"
        self.name = pod["metadata"]["name"]

    def cpu_seconds(self) -> float:
        return int(self.usage.read_text()) / 1e9


def resource(replicas: int, chunking: bool, parallel: int | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(SAMPLES["cpu-faster-whisper"]))
    pool = doc["spec"]["pools"][0]
    pool["replicas"] = replicas
    pool["resources"]["cpu"] = WORKER_CPU
    frontend = doc["spec"].setdefault("frontend", {})
    frontend["replicas"] = 1  # one /metrics for the chunk histograms
    frontend["chunking"] = {"enabled": chunking}
    if parallel is not None:
        frontend["chunking"]["maxParallelChunks"] = parallel
    return doc


def pods(kubectl: Kubectl, ns: str, component: str, count: int) -> list[dict[str, Any]]:
    """The component's `count` ready pods, once exactly that many are ready and none is
    terminating (a rolled frontend's old pod has gone)."""

    def settled() -> list[dict[str, Any]] | None:
        items = kubectl.pods(ns, NAME, component)
        ready = [
            p
            for p in items
            if not p["metadata"].get("deletionTimestamp")
            and any(c.get("ready") for c in p["status"].get("containerStatuses", []))
        ]
        return ready if len(ready) == count == len(items) else None

    found: list[dict[str, Any]] = wait_for(settled, timeout=600, interval=2,
                                           what=f"{count} ready {component} pod(s)")  # fmt: skip
    return found


def roll_then_scale(kubectl: Kubectl, ns: str, url: str, short: tuple[str, bytes, float],
                    fe: PodCPU, parallel: int | None) -> tuple[PodCPU, list[PodCPU]]:  # fmt: skip
    """From one worker replica: chunking on with `parallel` (the operator rolls the
    frontend), then two worker replicas, warmed up. One change at a time: the frontend's
    surge pod finds no room beside two workers. Returns the new frontend and workers."""
    kubectl.apply(resource(1, chunking=True, parallel=parallel), ns)
    wait_for(lambda: kubectl.pods(ns, NAME, "frontend")[0]["metadata"]["uid"] != fe.uid,
             timeout=300, interval=2, what="the frontend to roll")  # fmt: skip
    rolled = PodCPU(pods(kubectl, ns, "frontend", 1)[0])
    kubectl.apply(resource(2, chunking=True, parallel=parallel), ns)
    workers = [PodCPU(p) for p in pods(kubectl, ns, "worker", 2)]
    shorts(url, short, count=2)
    return rolled, workers


def run(quick: bool = False) -> dict[str, Any]:
    seconds = 120.0 if quick else 600.0
    baseline_count = SHORT_BASELINE // 2 if quick else SHORT_BASELINE
    rec, short, reference = material(RESULTS / "longaudio-node", seconds)

    say("bench longaudio-node: the test bed with its real node (building what is missing)")
    kubeconfig = testbed.cluster.up()
    kubectl = Kubectl(kubeconfig)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    runs: dict[str, dict[str, Any]] = {}
    say("phase 1: 1 worker replica, chunking off (the operator in the cluster)")
    with deployed_on_the_real_node(kubectl, kubeconfig, resource(1, chunking=False), "la",
                                   RELEASE, timeout=600) as (ns, _, _):  # fmt: skip
        svc = kubectl.json("get", "service", NAME, "-n", ns)
        url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}"
        fe = PodCPU(pods(kubectl, ns, "frontend", 1)[0])
        workers = [PodCPU(p) for p in pods(kubectl, ns, "worker", 1)]
        say(f"the frontend's Service: {url}; warming up")
        shorts(url, short, count=2)
        runs |= one_replica(url, rec, fe, workers, "chunking off")

        say("phase 2: chunking on (the frontend rolls), then 2 worker replicas")
        fe, workers = roll_then_scale(kubectl, ns, url, short, fe, parallel=None)
        say("(b) 2 replicas, chunking_strategy=auto")
        runs["b"] = reported("(b)", url, rec, fe, workers, chunked=True)
        runs["stream"] = streamed(url, rec, fe, workers)
        say(f"short requests: {baseline_count}, nothing else running")
        quiet = shorts(url, short, count=baseline_count)
        say("short requests beside a long one (b)")
        runs["b_with_shorts"], busy = beside_long(url, rec, short, fe, workers)
        say(f"short p50 {quiet['p50_s']:.3f} s alone, {busy['p50_s']:.3f} s beside the long one")

        say("phase 3: maxParallelChunks 1 (one chunk at a time: a pod stays free of chunks)")
        kubectl.apply(resource(1, chunking=True), ns)  # room for the frontend's surge pod
        pods(kubectl, ns, "worker", 1)
        fe, workers = roll_then_scale(kubectl, ns, url, short, fe, parallel=1)
        runs["b_parallel_1"], busy_one = beside_long(url, rec, short, fe, workers)
        say(f"maxParallelChunks 1: long {runs['b_parallel_1']['wall_s']:.1f} s, "
            f"short p50 {busy_one['p50_s']:.3f} s beside it")  # fmt: skip

    a, b, c, st = runs["a"], runs["b"], runs["c"], runs["stream"]
    found = verdict(runs, reference, quiet, busy)
    first, chunk_time = found["first_delta_s"], found["chunk_mean_latency_s"]
    one = runs["b_parallel_1"]
    result = {
        "where": WHERE, "cpus": len(os.sched_getaffinity(0)),
        "model": f"whisper tiny.en (faster-whisper worker pods, resources.cpu {WORKER_CPU}: 1 thread each)",
        "recording": {"seconds": rec.seconds, "sentences": len(rec.sentences), "words": len(rec.text.split())},
        "bare": reference, "runs": runs, **{k: v for k, v in found.items() if k != "shown"},
        "shorts_beside_long_parallel_1": busy_one,
        "short_p50_ratio_parallel_1": busy_one["p50_s"] / quiet["p50_s"],
    }  # fmt: skip
    table(f"One {rec.seconds:.0f} s request ({len(rec.sentences)} sentences), {WHERE}; tiny.en, 1 thread per worker pod",
          ["", "wall s", "x (a)", "WER %", "worker CPU s", "per pod", "frontend CPU s", "chunks", "chunk mean s"],
          [["bare engine, whole file, in-process", reference["wall_s"], a["wall_s"] / reference["wall_s"],
            reference["wer_pct"], reference["cpu_s"], "-", "-", "-", "-"]]
          + [[label, r["wall_s"], a["wall_s"] / r["wall_s"], r["wer_pct"], r["worker_cpu_s"],
              " + ".join(f"{x:.1f}" for x in r["worker_cpu_s_each"]), r["frontend_cpu_s"],
              r["chunks"], r["chunk_latency"]["mean"]]
             for label, r in (("(a) 1 pod, whole (chunking off)", a), ("(c) 1 pod, chunked (auto)", c),
                              ("(b) 2 pods, chunked (auto)", b), ("stream, 2 pods, chunked", st),
                              ("(b) beside short requests", runs["b_with_shorts"]),
                              ("(b) maxParallelChunks 1, beside short requests", one))])  # fmt: skip
    table("Streaming (2 pods)", ["", "seconds"],
          [["first delta (stream=true, chunked)", first],
           ["chunk latency in that request, mean", chunk_time],
           ["whole stream", st["wall_s"]]])  # fmt: skip
    table(f"Short requests ({short[2]:.1f} s sentence, one every second; 2 pods)",
          ["", "requests", "p50 s", "p99 s", "WER %"],
          [*short_rows(quiet, busy),
           ["beside it, maxParallelChunks 1", busy_one["requests"], busy_one["p50_s"], busy_one["p99_s"],
            busy_one["wer_pct"]],
           ["ratio of p50", "", busy_one["p50_s"] / quiet["p50_s"], "", ""]])  # fmt: skip
    targets_table(found["targets"], found["shown"])
    write("longaudio-node", result)
    return result
