"""Scaling benchmark on the test bed's real node: one row per event (cold start from zero,
ramp up, scale-down, pool rollout, frontend rollout, and each fault), under steady load
through the frontend's Service. The events are testbed/scenarios.py's, whose invariants the
e2e suite asserts; this reports the numbers: load offered and served, failures by status,
p50/p99 latency during the event, and the time until the replica count settled.

First, without the cluster, the scaling signal under issue 34's flapping case (four steady
clients whose uploads and parsing take as long as decoding), modelled around the frontend's
own accounting (testkit/autoscaling.py): the replica counts the HPA asks for, scaled on the
requests at the workers and on the audio."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

import testbed.cluster
from testbed import scenarios
from testbed.kube import CRD_FILE
from testbed.kubectl import Kubectl
from testbed.load import summary
from testkit.audio import SENTENCES, speak
from testkit.autoscaling import Clients, Hpa, Signal, simulate

from .common import say, table, write


def signals(seconds: float = 600.0) -> list[dict[str, Any]]:
    """The flapping case, modelled: one row per signal."""
    c, h = Clients(), Hpa()
    rows, results = [], []
    for signal in Signal:
        run = simulate(signal, c, h, seconds)
        target = (f"{h.requests_per_replica:g} request(s)" if signal == Signal.REQUESTS
                  else f"{h.target_queue_seconds:g} s of work")  # fmt: skip
        counts = " ".join(map(str, run.replicas[:24]))
        mean = statistics.mean(run.latencies)
        results.append({"signal": signal.value, "target": target, "replicas": run.replicas,
                        "changes": run.changes, "answered": len(run.latencies),
                        "mean_s": mean})  # fmt: skip
        rows.append([signal.value, target, counts, run.changes, len(run.latencies), mean])
    table(
        f"The scaling signal, modelled ({c.count} clients, {c.audio_seconds:g} s of audio each; "
        f"upload {c.upload:g} s, parse {c.parse:g} s, decode {c.decode:g} s, sequential "
        f"workers; HPA every {h.sync:g} s, scale-down window {h.scale_down_window:g} s, "
        f"{seconds:g} s)",
        ["signal", "target per replica", "replicas the HPA set (first 6 min)", "changes",
         "answered", "mean s"],
        rows,
    )  # fmt: skip
    return results


def run(quick: bool = False) -> dict[str, Any]:
    modelled = signals()
    say("bench scale: the test bed with its real node (building what is missing)")
    kubeconfig = testbed.cluster.up()
    kubectl = Kubectl(kubeconfig)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    sentence = SENTENCES[0]
    audio = speak(sentence, Path(tempfile.mkdtemp(prefix="bench-scale-"))).read_bytes()
    events = scenarios.EVENTS[:3] if quick else scenarios.EVENTS
    rows, results = [], []
    with scenarios.stack(kubectl, kubeconfig, audio, sentence) as s:
        for event in events:
            say(f"event: {event.__name__.replace('_', ' ')}")
            r = event(s)
            stats = summary(r.outcomes, r.seconds)
            results.append({"event": r.event, "seconds": round(r.seconds, 1),
                            "settle_s": None if r.settle_s is None else round(r.settle_s, 1),
                            **stats, **r.notes})  # fmt: skip
            failed = ", ".join(f"{k}: {v}" for k, v in stats["failures"].items()) or "0"
            rows.append([r.event, stats["offered_rps"], stats["served_rps"], failed,
                         stats["p50_s"], stats["p99_s"],
                         "" if r.settle_s is None else round(r.settle_s, 1),
                         ", ".join(f"{k} {v}" for k, v in r.notes.items()
                                   if not isinstance(v, dict | list | tuple))])  # fmt: skip
            for stage, lines in r.notes.get("stages", {}).items():  # stuck rollout: status
                say(f"  [{stage}] " + " | ".join(lines))
            for line in r.notes.get("status", []):  # node faults: status through the event
                say(f"  status {line}")
    table(
        "Scaling and faults on the real node (CPU sample, tiny.en, 1 pool min 0 max "
        f"{scenarios.MAX}, 2 frontends; steady load through the Service)",
        ["event", "offered req/s", "served req/s", "failures", "p50 s", "p99 s",
         "settled in s", "notes"],
        rows,
    )  # fmt: skip
    data = {"signals": modelled, "events": results}
    write("scale", data)
    return data
