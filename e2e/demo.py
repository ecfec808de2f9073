#!/usr/bin/env python3
"""The demo (`make demo`): the whole path, on this machine, with real transcription.

1. brings up the local test bed (a real control plane; KWOK simulates nodes and pods),
2. installs the Helm chart (CRD, RBAC, the operator's Deployment),
3. runs the operator as a local process with exactly the chart's ServiceAccount permissions,
4. applies samples/cpu-faster-whisper.yaml and waits for it to be Ready,
5. runs the CPU worker and the frontend as local processes, configured from the route table
   the operator wrote (the pods in the test bed are simulated: nothing runs inside them),
6. transcribes a sentence spoken by espeak-ng with the OpenAI Python client, and prints the
   transcript, the resource's status and a few metrics.

`python e2e/demo.py down` (`make demo-down`) stops everything it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]
import testbed  # noqa: E402

STATE = testbed.CACHE / "demo"
NAMESPACE, SYSTEM_NS, RELEASE = "speech", "transcription-system", "transcription-operator"
SAMPLE = ROOT / "samples" / "cpu-faster-whisper.yaml"
WORKER_PORT, FRONTEND_PORT, METRICS_PORT, HEALTH_PORT = 18000, 18080, 18090, 18091
SENTENCE = "Please send me the report before the end of the week."


def step(n: int, msg: str) -> None:
    print(f"\n\033[1m[{n}/6] {msg}\033[0m", flush=True)


def kubectl(*args: str, input: str | None = None, check: bool = True) -> str:
    return testbed.kubectl(*args, input=input, check=check)


def spawn(name: str, args: list[str], env: dict[str, str] | None = None) -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    log = open(STATE / f"{name}.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                            start_new_session=True)  # fmt: skip
    pids = _pids()
    pids[name] = proc.pid
    (STATE / "pids.json").write_text(json.dumps(pids))
    return proc.pid


def _pids() -> dict[str, int]:
    path = STATE / "pids.json"
    return json.loads(path.read_text()) if path.exists() else {}


def wait_http(url: str, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what} did not come up within {timeout:.0f}s; see its log in {STATE}")


def sa_kubeconfig() -> Path:
    token = kubectl("create", "token", RELEASE, "-n", SYSTEM_NS, "--duration=24h").strip()
    admin = yaml.safe_load(testbed.KUBECONFIG.read_text())
    STATE.mkdir(parents=True, exist_ok=True)
    path = STATE / "operator.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "operator",
        "clusters": [{"name": "testbed", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "testbed", "user": "operator"}}],
    }))  # fmt: skip
    return path


def wait_ready(name: str, timeout: float = 180) -> dict[str, Any]:
    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        td = json.loads(kubectl("get", "tdeploy", name, "-n", NAMESPACE, "-o", "json"))
        conds = {c["type"]: c for c in (td.get("status") or {}).get("conditions", [])}
        ready = conds.get("Ready", {})
        line = (
            f"    Ready={ready.get('status', '?')} ({ready.get('reason', 'waiting for the operator')}) "
            f"{ready.get('message', '')}"
        )
        if line != last:
            print(line, flush=True)
            last = line
        if ready.get("status") == "True":
            return dict(td)
        time.sleep(1)
    raise SystemExit(
        f"{name} was not Ready after {timeout:.0f}s: kubectl describe tdeploy -n {NAMESPACE} {name}"
    )


def metric_lines(url: str, prefixes: tuple[str, ...]) -> list[str]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return [
        line
        for line in text.splitlines()
        if line.startswith(prefixes) and not line.endswith(" 0.0")
    ]


def up() -> int:
    py = sys.executable
    step(1, "local Kubernetes test bed (first run builds the binaries: ~17 min, then cached)")
    testbed.up()

    step(2, "Helm chart: CRD, RBAC, operator Deployment (its pod is simulated by KWOK)")
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": SYSTEM_NS, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))  # fmt: skip
    out = subprocess.run([str(testbed.HELM.path("helm")), "upgrade", "--install", RELEASE, str(ROOT / "charts" / RELEASE),
                          "-n", SYSTEM_NS, "--wait", "--kubeconfig", str(testbed.KUBECONFIG)],
                         capture_output=True, text=True)  # fmt: skip
    if out.returncode:
        raise SystemExit(f"helm install failed: {out.stderr}")
    print(
        "    "
        + "\n    ".join(
            line
            for line in out.stdout.splitlines()
            if line.startswith(("NAME:", "STATUS:", "REVISION:"))
        )
    )

    step(3, "operator, as a local process with the chart's ServiceAccount token")
    stop_processes()
    spawn("operator", [py, "-m", "transcription_operator.main", "--kubeconfig", str(sa_kubeconfig()),
                       "--metrics-port", str(METRICS_PORT), "--health-port", str(HEALTH_PORT)])  # fmt: skip
    wait_http(f"http://127.0.0.1:{HEALTH_PORT}/healthz", "the operator")

    step(4, f"apply {SAMPLE.relative_to(ROOT)} in namespace {NAMESPACE} (PodSecurity: restricted)")
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))  # fmt: skip
    kubectl("apply", "-n", NAMESPACE, "-f", str(SAMPLE))
    name = yaml.safe_load(SAMPLE.read_text())["metadata"]["name"]
    wait_ready(name)

    step(5, "CPU worker and frontend as local processes, from the operator's route table")
    cm = json.loads(kubectl("get", "configmap", f"{name}-routes", "-n", NAMESPACE, "-o", "json"))
    table = json.loads(cm["data"]["routes.json"])
    worker = f"http://127.0.0.1:{WORKER_PORT}"
    for pool in table["pools"]:
        pool["endpoints"] = [worker]  # the simulated pods' stand-in: one real local worker
    routes = STATE / "routes.json"
    routes.write_text(json.dumps(table, indent=2))
    names = [table["model"], *table["aliases"]]
    spawn("worker", [py, "-m", "transcription_worker.main", "--port", str(WORKER_PORT),
                     *[a for n in names for a in ("--served-name", n)]])  # fmt: skip
    spawn("frontend", [py, "-m", "transcription_frontend.main", "--routes", str(routes),
                       "--port", str(FRONTEND_PORT)])  # fmt: skip
    wait_http(f"{worker}/health", "the CPU worker")
    wait_http(f"http://127.0.0.1:{FRONTEND_PORT}/ready", "the frontend")

    step(6, "transcribe with the OpenAI Python client through the frontend")
    from openai import OpenAI

    from tests.audio import speak, wer

    wav = speak(SENTENCE, STATE / "audio")
    client = OpenAI(base_url=f"http://127.0.0.1:{FRONTEND_PORT}/v1", api_key="demo")
    start = time.monotonic()
    result = client.audio.transcriptions.create(model="whisper-1", file=wav.open("rb"))
    took = time.monotonic() - start
    print(f"    spoken:     {SENTENCE}")
    print(f"    transcript: {result.text.strip()}")
    print(f"    word error rate {wer(SENTENCE, result.text):.0%}, {took:.2f}s")
    print("\n$ kubectl get tdeploy -n speech -o wide")
    print(kubectl("get", "tdeploy", "-n", NAMESPACE, "-o", "wide"))
    print("metrics:")
    for line in metric_lines(
        f"http://127.0.0.1:{FRONTEND_PORT}/metrics", ("transcription_frontend_requests_total",)
    ):
        print(f"    {line}")
    for line in metric_lines(
        f"{worker}/metrics", ("vllm:e2e_request_latency_seconds_sum", "vllm:request_success_total")
    ):
        print(f"    {line}")
    for line in metric_lines(
        f"http://127.0.0.1:{METRICS_PORT}/metrics", ("transcription_operator_reconciles_total",)
    ):
        print(f"    {line}")
    print(f"\nStill running: frontend http://127.0.0.1:{FRONTEND_PORT}/v1, worker {worker}, operator; "
          f"KUBECONFIG={testbed.KUBECONFIG}\nTry: curl http://127.0.0.1:{FRONTEND_PORT}/v1/audio/transcriptions "
          f"-F model=whisper-1 -F response_format=srt -F file=@{wav}\nStop everything: make demo-down")  # fmt: skip
    return 0


def stop_processes(grace: float = 20.0) -> None:
    """SIGTERM each process group, wait for it to exit (the operator shuts down gracefully),
    SIGKILL what is left after `grace` seconds."""
    pids = _pids()
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for name, pid in pids.items():
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        print(f"stopped {name} (pid {pid})")
    (STATE / "pids.json").unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A child of ours that exited but was not reaped yet is a zombie: gone for our purpose.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def down() -> int:
    stop_processes()
    testbed.down()
    return 0


if __name__ == "__main__":
    sys.exit(down() if sys.argv[1:] == ["down"] else up())
