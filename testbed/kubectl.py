"""kubectl (the pinned one) against a kubeconfig, with JSON in and out: the one client the
test bed, its suites and the benchmarks use. Its plain reads (`get ... -o json`) are answered
in this process, with kubectl's output (kubeget.py): the suites poll the cluster about 1,800
times a run, at 38 ms of CPU a kubectl process.

Only the standard library is used (like cluster.py, which runs before the virtual
environment exists).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import toolchain
from testbed import kubeget
from testkit.host import split_cmdline

WAIT = re.compile(r"--timeout=(\d+)s")  # kubectl wait's (and delete's) own bound


class Kubectl:
    """kubectl against one cluster. A failed command raises AssertionError naming it (the
    suites' failures read as such); `timeout` (seconds, None: none) bounds each command."""

    def __init__(
        self, kubeconfig: Path, timeout: float | None = 120, in_process: bool = True
    ) -> None:
        self.kubeconfig = kubeconfig
        self.timeout = timeout
        self.binary = str(toolchain.KUBERNETES.path("kubectl"))
        # `get ... -o json` answered in this process where it can be (kubeget.py).
        self.reader = kubeget.Reader(self.binary, kubeconfig) if in_process else None

    def run(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        get = kubeget.parse(args) if self.reader and input is None else None
        proc = self.reader.answer(get, self._timeout(args)) if self.reader and get else None
        if proc is None:
            proc = subprocess.run(
                [self.binary, "--kubeconfig", str(self.kubeconfig), *args],
                input=input, capture_output=True, text=True, timeout=self._timeout(args),
            )  # fmt: skip
        if check and proc.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def _timeout(self, args: tuple[str, ...]) -> float | None:
        """The command's bound: `timeout`, or longer for a command that says it waits longer
        (`wait --timeout=420s`): kubectl's own timeout then ends it, with its message."""
        waits = [float(m.group(1)) for a in args if (m := WAIT.fullmatch(a))]
        if self.timeout is None or not waits:
            return self.timeout
        return max(self.timeout, max(waits) + 30)

    def __call__(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """The command's output (with `check=False`, whatever it printed, even on failure)."""
        return self.run(*args, input=input, check=check).stdout

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))

    def apply(self, obj: dict[str, Any] | str, namespace: str | None = None) -> str:
        text = obj if isinstance(obj, str) else json.dumps(obj)
        ns = ["-n", namespace] if namespace else []
        return self("apply", *ns, "-f", "-", input=text)

    def pods(
        self, namespace: str, instance: str, component: str, pool: str | None = None
    ) -> list[dict[str, Any]]:
        """The pods of one component of a resource (of one pool, for workers), less those
        being deleted."""
        selector = f"app.kubernetes.io/instance={instance},app.kubernetes.io/component={component}"
        if pool:
            selector += f",transcription.dev/pool={pool}"
        items: list[dict[str, Any]] = self.json("get", "pods", "-n", namespace, "-l", selector)[
            "items"
        ]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def service_url(self, namespace: str, name: str) -> str:
        """The ClusterIP URL of a Service's first port."""
        svc = self.json("get", "service", name, "-n", namespace)
        return f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}"

    def argv(self, namespace: str, pod: str) -> list[str]:
        """The command line of a pod's first process (its /proc/1/cmdline)."""
        raw = self("exec", "-n", namespace, pod, "--", "cat", "/proc/1/cmdline")
        return split_cmdline(raw.encode())
