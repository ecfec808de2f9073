"""Who can reach whom on the test bed's real node: probe pods that try TCP connections and
name resolution, and the matrix they print (source x destination x allowed/refused).

A probe is a pod of the test bed's base image that listens on LISTEN_PORT (a target for
other probes: egress to a pod) and runs PROBE: for each `host:port` it tries a TCP
connection (3 s), for each `dns:name` a lookup, and prints one JSON object. A connection
refused by a policy (kube-router rejects) and one that times out (dropped) are both
"refused"; every port probed has a listener, which the allowed cells show.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from testbed import images
from testbed.kube import wait_for
from testbed.kubectl import Kubectl

ALLOWED, REFUSED = "allowed", "refused"
LISTEN_PORT = 8080
LISTEN = f"""
import socket
server = socket.create_server(("", {LISTEN_PORT}))
while True:
    server.accept()[0].close()
"""

PROBE = """
import json, socket, sys
out = {}
for target in sys.argv[1:]:
    try:
        if target.startswith("dns:"):
            socket.getaddrinfo(target[4:], 443)
        else:
            host, port = target.rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=3).close()
        out[target] = "allowed"
    except OSError as e:
        out[target] = "refused " + type(e).__name__
print(json.dumps(out))
"""

RESTRICTED = {  # PodSecurity `restricted`, which the suites' namespaces enforce
    "runAsNonRoot": True,
    "runAsUser": 65534,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def probe_pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A pod that only listens, so that probes run in it (and reach it) once the policy
    engine knows it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "probe",
                    "image": images.ref(images.BASE),
                    "imagePullPolicy": "Never",
                    "command": ["timeout", "900", "python3", "-c", LISTEN],
                    "securityContext": RESTRICTED,
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                }
            ],
        },
    }


def start_probes(kubectl: Kubectl, pods: dict[str, tuple[str, dict[str, str]]]) -> None:
    """Create the probe pods (name -> (namespace, labels)) and wait until each runs."""
    for name, (namespace, labels) in pods.items():
        kubectl.apply(probe_pod(name, labels), namespace)
    for name, (namespace, _) in pods.items():

        def running(name: str = name, namespace: str = namespace) -> bool:
            pod = kubectl.json("get", "pod", name, "-n", namespace)
            return bool(pod["status"].get("phase") == "Running")

        wait_for(running, timeout=120, what=f"probe pod {namespace}/{name} to run")


def probe(kubectl: Kubectl, namespace: str, pod: str, targets: Sequence[str],
          container: str | None = None) -> dict[str, str]:  # fmt: skip
    """Run PROBE in a pod; each target's outcome, "allowed" or "refused <error>"."""
    which = ["-c", container] if container else []
    out = kubectl("exec", "-n", namespace, pod, *which, "--", "python3", "-c", PROBE, *targets)
    result: dict[str, str] = json.loads(out.strip().splitlines()[-1])
    return result


def verdict(outcome: str) -> str:
    return ALLOWED if outcome == ALLOWED else REFUSED


def matrix(results: dict[str, dict[str, str]], names: dict[str, str]) -> str:
    """A table: one row per source, one column per destination (names: target -> column)."""
    rows = [["source", *names.values()]]
    rows += [[source, *(got.get(t, "-") for t in names)] for source, got in results.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def mismatches(results: dict[str, dict[str, str]],
               expected: dict[str, dict[str, str]]) -> list[str]:  # fmt: skip
    """Cells whose verdict differs from what was expected."""
    return [
        f"{source} -> {target}: expected {want}, got {results[source].get(target)}"
        for source, row in expected.items()
        for target, want in row.items()
        if verdict(results[source].get(target, "")) != want
    ]
