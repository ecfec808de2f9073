"""Who can reach whom on the test bed's real node: probe pods that try TCP connections and
name resolution, and the matrix they print (source x destination x allowed/refused).

A probe is a pod of the test bed's base image running PROBE: for each `host:port` it tries a
TCP connection (3 s), for each `dns:name` a lookup, and prints one JSON object. A
connection refused by a policy (kube-router rejects) and one that times out (dropped) are
both "refused"; every port probed has a listener, which the allowed cells show.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from testbed import images
from testbed.kube import Kubectl, wait_for

ALLOWED, REFUSED = "allowed", "refused"

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


def probe_pod(name: str, labels: dict[str, str], targets: Sequence[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "probe",
                    "image": images.ref(images.BASE),
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", PROBE, *targets],
                    "securityContext": RESTRICTED,
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                }
            ],
        },
    }


def run_probe(kubectl: Kubectl, namespace: str, name: str, labels: dict[str, str],
              targets: Sequence[str]) -> dict[str, str]:  # fmt: skip
    """Run one probe pod to completion; its results, each "allowed" or "refused ..."."""
    kubectl.apply(probe_pod(name, labels, targets), namespace)

    def finished() -> dict[str, Any] | None:
        pod = kubectl.json("get", "pod", name, "-n", namespace)
        return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None

    pod = wait_for(finished, timeout=120, what=f"probe pod {namespace}/{name} to finish")
    logs = kubectl("logs", name, "-n", namespace)
    assert pod["status"]["phase"] == "Succeeded", logs
    kubectl("delete", "pod", name, "-n", namespace, "--wait=false")
    result: dict[str, str] = json.loads(logs.strip().splitlines()[-1])
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
