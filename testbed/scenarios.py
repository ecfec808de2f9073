"""Scaling events and faults on the real node, under load: shared by the e2e tests that
assert what must hold (e2e/test_scaling.py) and `python -m bench scale`, which reports the
numbers.

The stack: the operator in the cluster (the chart, from its image) running the CPU sample
with an autoscaled pool (KEDA; the frontend is its external-push scaler) and two frontend
replicas. Each event runs while `Load` (testbed/load.py) sends steady traffic through the
frontend's Service, and returns a `Result`: the requests started during the event and how
long the cluster took to settle.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import testbed.cluster
import testbed.realnode
from testbed import faults, images
from testbed.kube import SAMPLES, condition, create_namespace, td_get, wait_for
from testbed.kubectl import Kubectl
from testbed.load import Load, Outcome, failures
from testbed.operators import operator_in_cluster
from testkit.audio import wer
from testkit.realtime import conversation, transcribe_turns, transcripts
from transcription_api.units import quantity

NAME, POOL = "whisper-cpu", "cpu"
RELEASE = "scaling-operator"
DELAY = "20s"  # scaleDownDelay: short, so that scale-down is seen
MAX = 2


ANSWERED = re.compile(r" 200 [0-9.]+ms ")  # a frontend's log line of a request answered


def resource(**pool: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(SAMPLES["cpu-faster-whisper"]))
    p = doc["spec"]["pools"][0]
    p.pop("replicas", None)
    # Room on the 2-core node for a rollout's surge: 3 workers and 2 frontends, or 2 and 3.
    p["resources"]["cpu"] = "400m"
    # tiny.en on 400m of CPU decodes at least a second of audio a second: said up front, so
    # that the first scaling decisions need no measurement. Measured, a worker batching six
    # requests gets through 3-4 audio-seconds a second: the ramp's 6 clients with a 3.5 s
    # sentence each keep about 6 s of work queued, one client about 1 s. A target of 2 s per
    # replica makes the six want 2 replicas (the maximum) even with workers twice as fast, and
    # one client 1; the default (10 s) would rightly leave six such clients on one replica.
    p["autoscaling"] = {"minReplicas": 0, "maxReplicas": MAX, "scaleDownDelay": DELAY,
                        "audioSecondsPerReplica": 1, "targetQueueSeconds": 2}  # fmt: skip
    p.update(pool)
    doc["spec"]["frontend"] = {
        "replicas": 2,
        "resources": {"cpu": "250m", "memory": "512Mi"},
        # A realtime session opened on a pool at zero waits for it without sending.
        "limits": {"realtimeIdleTimeoutSeconds": 300},
    }
    return doc


@dataclass
class Result:
    event: str
    outcomes: list[Outcome]
    seconds: float  # how long the event's window lasted
    settle_s: float | None  # until the replica count settled (None: not measured)
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class Scaling:
    kubectl: Kubectl
    namespace: str
    system_namespace: str
    audio: bytes
    sentence: str
    release: str  # the chart's: 2 operator replicas, one leading (a Lease)
    # Through the long faults (the API server's, the node's daemons', the stuck rollout),
    # each client's share of the time with a request out (`Load.duty`). `bench scale` keeps
    # 1, the most the clients can offer; the e2e tests need requests throughout, and a closed
    # loop for minutes would only take the CPUs from the suites that run beside them. Events
    # of an instant (a kill, a deletion, a rollout's switch of pods) always send back to
    # back: a request in flight at that instant is their point.
    duty: float = 1.0

    @property
    def url(self) -> str:
        svc = self.kubectl.json("get", "service", NAME, "-n", self.namespace)
        return f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}"

    def replicas(self) -> tuple[int, int]:
        """(desired, ready) of the pool's Deployment, as KEDA/HPA set them."""
        out = self.kubectl.run("get", "deployment", f"{NAME}-{POOL}", "-n", self.namespace,
                               "-o", "json", check=False)  # fmt: skip
        if out.returncode:
            return -1, -1  # not created yet
        dep = json.loads(out.stdout)
        return int(dep["spec"].get("replicas", 0)), int(dep["status"].get("readyReplicas") or 0)

    def pods(self, component: str) -> list[dict[str, Any]]:
        return self.kubectl.pods(self.namespace, NAME, component)

    def load(self, clients: int, stream: bool = False, duty: float = 1.0) -> Load:
        return Load(self.url, self.audio, clients, stream=stream, duty=duty)

    def wait_replicas(self, desired: int, timeout: float) -> float:
        start = time.monotonic()
        wait_for(lambda: self.replicas() == (desired, desired), timeout=timeout, interval=1,
                 what=f"pool {POOL} at {desired} ready replicas")  # fmt: skip
        return time.monotonic() - start

    def apply(self, doc: dict[str, Any]) -> None:
        self.kubectl.apply(doc, self.namespace)

    def leader(self) -> str:
        """The operator pod the Lease names ('' while nobody holds it)."""
        return self.lease()[0]

    def operators(self, lines: int = 25) -> str:
        """What the operator replicas say: the Lease's holder, each pod's restarts and the
        last `lines` of its log (probes left out; of its previous container too, after a
        restart): what a failed wait on the operator prints."""
        out = [f"lease held by {self.leader() or 'nobody'}"]
        for pod in self.kubectl.json("get", "pods", "-n", self.system_namespace)["items"]:
            name = pod["metadata"]["name"]
            restarts = sum(c.get("restartCount", 0)
                           for c in pod["status"].get("containerStatuses") or [])  # fmt: skip
            out.append(f"--- {name} ({restarts} restarts)")
            for flags in ([["--previous"]] if restarts else []) + [[]]:
                out.append(self._log_tail(self.system_namespace, name, lines, 500, flags,
                                          lambda line: "/healthz" in line or "'queue_depth'" in line))  # fmt: skip
        return "\n".join(out)

    def frontends(self, lines: int = 40) -> str:
        """The last `lines` of each frontend pod's log (probes, metrics and answered requests
        left out): what a failed request of an event prints, so that its frontend's view is on
        record."""

        def noise(line: str) -> bool:
            return any(p in line for p in ("/healthz", "/readyz", "/metrics")) or bool(
                ANSWERED.search(line)
            )

        return "\n".join(
            f"--- {name}\n" + self._log_tail(self.namespace, name, lines, 2000, [], noise)
            for name in (pod["metadata"]["name"] for pod in self.pods("frontend"))
        )

    def _log_tail(
        self, namespace: str, pod: str, lines: int, read: int, flags: list[str],
        noise: Callable[[str], bool],
    ) -> str:  # fmt: skip
        """The last `lines` of a pod's log that are not `noise`, of the last `read` lines
        (kubectl's error, if it has none)."""
        log = self.kubectl.run("logs", "-n", namespace, pod, f"--tail={read}", *flags,
                               check=False)  # fmt: skip
        said = [line for line in log.stdout.splitlines() if not noise(line)]
        return "\n".join(said[-lines:]) or log.stderr.strip()

    def lease(self) -> tuple[str, datetime]:
        """The Lease's holder ('' while nobody holds it) and when it was last renewed."""
        out = self.kubectl.run("get", "lease", f"{self.release}-transcription-operator",
                               "-n", self.system_namespace, "-o", "json", check=False)  # fmt: skip
        spec = json.loads(out.stdout)["spec"] if not out.returncode else {}
        renewed = spec.get("renewTime")
        when = datetime.fromisoformat(renewed) if renewed else datetime.min.replace(tzinfo=UTC)
        return str(spec.get("holderIdentity") or ""), when


@contextmanager
def stack(
    kubectl: Kubectl, cluster: Path, audio: bytes, sentence: str, duty: float = 1.0
) -> Iterator[Scaling]:
    ns = create_namespace(kubectl, "s", simulated=False)
    kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    with operator_in_cluster(kubectl, cluster, RELEASE, ns) as (system_ns, release):
        kubectl.apply(resource(), ns)
        try:
            yield Scaling(kubectl, ns, system_ns, audio, sentence, release, duty)
        finally:
            kubectl.run("delete", "tdeploy", NAME, "-n", ns, "--wait=false", check=False)
            kubectl.run("delete", "namespace", ns, "--wait=false", check=False)


def _during(
    s: Scaling, event: str, clients: int, act: Callable[[], float | None], duty: float = 1.0
) -> Result:
    """Run `act` (the event; returns its settle time) under steady load, each client with a
    request out `duty` of the time, then let the load run a few more requests past it."""
    with s.load(clients, duty=duty) as load:
        load.wait_for_successes(clients, timeout=300)
        t0 = time.monotonic()
        settle = act()
        load.wait_for_successes(len(load.outcomes) + clients, timeout=180)
        t1 = time.monotonic()
    result = Result(event, load.between(t0, t1), t1 - t0, settle)
    if failures(result.outcomes):  # what the frontends saw goes with the failure
        result.notes["frontends"] = s.frontends()
    return result


def status_line(s: Scaling) -> str:
    """The resource's (Ready, Progressing, Degraded) conditions as one line; 'no answer
    from the API server' when unread."""
    out = s.kubectl.run("get", "tdeploy", NAME, "-n", s.namespace, "-o", "json",
                        "--request-timeout=3s", check=False)  # fmt: skip
    if out.returncode:
        return "no answer from the API server"
    td = json.loads(out.stdout)
    return ", ".join(f"{t}={c.get('status')} {c.get('reason')}"
                     for t in CONDITIONS if (c := condition(td, t)))  # fmt: skip


class StatusTimeline:
    """What the resource's status said through an event: its (Ready, Progressing,
    Degraded) conditions read once a `interval` in a thread, each change kept with the
    seconds since the start ('+4.1s Ready=True Ready, Progressing=False Complete, ...'). A
    read that gets no answer (the API server away) is kept as such."""

    def __init__(self, s: Scaling, interval: float = 1.0) -> None:
        self.s, self.interval = s, interval
        self.lines: list[str] = []
        self._last = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> StatusTimeline:
        """Starts with a first reading, taken before the caller's event begins."""
        self._t0 = time.monotonic()
        self._last = status_line(self.s)
        self.lines.append(f"+0.0s {self._last}")
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _watch(self) -> None:
        while not self._stop.is_set():
            line = status_line(self.s)
            if line != self._last:
                self.lines.append(f"+{time.monotonic() - self._t0:.1f}s {line}")
                self._last = line
            self._stop.wait(self.interval)


def _ready_again(s: Scaling) -> None:
    """Wait until status says Ready=True and not Degraded: before a fault (the status lags
    the pool the load has just woken by a second or so), and as it must once a fault is
    over (Progressing may be True: the autoscaler can be moving the pool under the load)."""
    wait_for(lambda: (line := status_line(s)).startswith("Ready=True")
             and "Degraded=True" not in line,
             timeout=120, interval=1, what="status Ready=True, not Degraded")  # fmt: skip


# --------------------------------------------------------------------------- events


def cold_start(s: Scaling) -> Result:
    """The idle pool at zero (status: Ready, ScaledToZero); the first request is held by the
    frontend, wakes the pool, and is answered."""
    s.wait_replicas(0, timeout=300)

    def scaled_to_zero() -> dict[str, Any] | None:
        td = td_get(s.kubectl, s.namespace, NAME)
        return td if condition(td, "Ready").get("reason") == "ScaledToZero" else None

    wait_for(scaled_to_zero, timeout=60, what="Ready=True ScaledToZero")
    t0 = time.monotonic()
    with Load(s.url, s.audio, 1) as load:
        load.wait_for_successes(1, timeout=300)
    first = load.outcomes[0]
    return Result("cold start from zero", load.outcomes, time.monotonic() - t0, None,
                  {"time_to_first_response_s": round(first.seconds, 1)})  # fmt: skip


def ramp_up(s: Scaling) -> Result:
    with s.load(clients=6) as load:
        t0 = time.monotonic()
        settle = s.wait_replicas(MAX, timeout=300)
        load.wait_for_successes(len(load.outcomes) + 4, timeout=180)
        t1 = time.monotonic()
    return Result(f"ramp up to {MAX} (6 clients)", load.between(t0, t1), t1 - t0, settle)


def scale_down(s: Scaling) -> Result:
    """After the load stops: back to zero once idle for scaleDownDelay."""
    t0 = time.monotonic()
    settle = s.wait_replicas(0, timeout=300)
    return Result(f"scale-down to 0 (delay {DELAY})", [], time.monotonic() - t0, settle)


def realtime_from_zero(s: Scaling) -> Result:
    """The idle pool at zero; a realtime session opens (OpenAI's SDK, server VAD) and
    streams one sentence: the open session is load (KEDA hears of it from the frontend's
    scaler), so the pool wakes, the turn is held meanwhile and then transcribed."""
    s.wait_replicas(0, timeout=300)
    audio = conversation([s.sentence], Path(tempfile.mkdtemp(prefix="realtime-zero-")))
    woke: list[float] = []

    def watch() -> None:  # when the pool's first replica is ready
        wait_for(lambda: s.replicas()[1] >= 1, timeout=300, interval=1, what="pool woken")
        woke.append(time.monotonic())

    watcher = threading.Thread(target=watch, daemon=True)
    t0 = time.monotonic()
    watcher.start()
    outcome: Outcome
    try:
        got = transcripts(asyncio.run(transcribe_turns(s.url, audio, 1, pace=1.0)))
        error = "" if got and wer(s.sentence, got[0]) <= 0.25 else f"transcripts {got}"
        outcome = Outcome(t0, time.monotonic(), 200 if not error else 0, error)
    except Exception as e:  # the session failed: reported as the outcome
        outcome = Outcome(t0, time.monotonic(), 0, f"{type(e).__name__}: {e}")
    watcher.join(timeout=300)
    notes: dict[str, Any] = {"session_s": round(outcome.seconds, 1)}
    if woke:
        notes["pool_ready_after_s"] = round(woke[0] - t0, 1)
    return Result("realtime session from zero", [outcome], outcome.seconds,
                  woke[0] - t0 if woke else None, notes)  # fmt: skip


def pool_rollout(s: Scaling) -> Result:
    def act() -> float:
        old = {p["metadata"]["name"] for p in s.pods("worker")}
        start = time.monotonic()
        s.apply(resource(env=[{"name": "ROLLOUT", "value": str(time.time())}]))
        wait_for(
            lambda: not ({p["metadata"]["name"] for p in s.pods("worker")} & old)
            and s.replicas()[1] >= 1 and s.replicas()[0] == s.replicas()[1],
            timeout=300, interval=1, what="the pool's pods replaced",
        )  # fmt: skip
        return time.monotonic() - start

    return _during(s, "pool rollout (spec change)", 3, act)


def frontend_rollout(s: Scaling) -> Result:
    def act() -> float:
        old = {p["metadata"]["name"] for p in s.pods("frontend")}
        doc = resource()
        doc["spec"]["pod"] = {"annotations": {"rollout": str(time.time())}}
        start = time.monotonic()
        s.apply(doc)
        wait_for(lambda: not ({p["metadata"]["name"] for p in s.pods("frontend")} & old)
                 and _all_ready(s.pods("frontend")),
                 timeout=300, interval=1, what="the frontend's pods replaced")  # fmt: skip
        return time.monotonic() - start

    return _during(s, "frontend rollout", 3, act)


def worker_killed(s: Scaling) -> Result:
    def act() -> float:
        pod = _a_ready_pod(s, "worker")
        name = pod["metadata"]["name"]
        restarts = pod["status"]["containerStatuses"][0]["restartCount"]
        start = time.monotonic()
        faults.kill_container(pod)

        def back() -> bool:
            pods = s.pods("worker")
            same = [p for p in pods if p["metadata"]["name"] == name]
            if not same:  # a scale-down removed it (a ReplicaSet takes unready pods first)
                return bool(pods) and _all_ready(pods)
            return _all_ready(same) and (
                same[0]["status"]["containerStatuses"][0]["restartCount"] > restarts
            )

        try:
            wait_for(back, timeout=300, interval=1, what="the killed worker restarted and ready")
        except AssertionError as e:
            raise AssertionError(f"{e}; worker pods now: {pod_states(s.pods('worker'))}") from None
        return time.monotonic() - start

    return _during(s, "worker container SIGKILL", 3, act)


def frontend_deleted(s: Scaling) -> Result:
    def act() -> float:
        victim = _a_ready_pod(s, "frontend")["metadata"]["name"]
        start = time.monotonic()
        s.kubectl("delete", "pod", victim, "-n", s.namespace, "--wait=false")
        wait_for(lambda: len(s.pods("frontend")) == 2 and _all_ready(s.pods("frontend"))
                 and victim not in {p["metadata"]["name"] for p in s.pods("frontend")},
                 timeout=180, interval=1, what="the frontend replaced")  # fmt: skip
        return time.monotonic() - start

    return _during(s, "frontend pod deleted (2 replicas)", 3, act)


def api_server_restarted(s: Scaling) -> Result:
    result = _during(s, "API server restart", 2, faults.restart_api_server, s.duty)
    # The operator's watches resumed: a child deleted now is restored.
    svc = f"{NAME}-scaler"
    uid = s.kubectl.json("get", "service", svc, "-n", s.namespace)["metadata"]["uid"]
    s.kubectl("delete", "service", svc, "-n", s.namespace)

    def restored() -> bool:
        o = s.kubectl.run("get", "service", svc, "-n", s.namespace, "-o", "json", check=False)
        return o.returncode == 0 and json.loads(o.stdout)["metadata"]["uid"] != uid

    # Within 90 s: a watch's reconnects back off up to 10 s apart, and a request caught by the
    # restart waits out its read timeout (30 s) before its reconcile retries.
    try:
        wait_for(restored, timeout=90, what="the operator to restore a deleted child after the restart")  # fmt: skip
    except AssertionError as e:
        raise AssertionError(f"{e}\n{s.operators()}") from None
    return result


def operator_leader_killed(s: Scaling) -> Result:
    """SIGKILL the leading operator replica as a pool rollout starts. A new term begins: the
    kubelet restarts the container in place and it resumes its own Lease (its identity is the
    pod's name), or, if that takes longer, the standby takes the Lease once it expires
    (15 s); either finishes the rollout, with no duplicate children."""
    notes: dict[str, Any] = {}

    def act() -> float:
        leader = s.leader()
        pod = s.kubectl.json("get", "pod", leader, "-n", s.system_namespace)
        restarts = pod["status"]["containerStatuses"][0]["restartCount"]
        old = {p["metadata"]["name"] for p in s.pods("worker")}
        start, killed_at = time.monotonic(), datetime.now(UTC)
        s.apply(resource(env=[{"name": "ROLLOUT", "value": str(time.time())}]))
        faults.kill_container(pod)

        def new_term() -> str:
            """Who leads now: the standby, or the killed leader's container restarted in
            place by the kubelet (same pod, same identity: it resumes its own Lease at once,
            the old process being dead), renewing the Lease since the kill."""
            holder, renewed = s.lease()
            if not holder or renewed <= killed_at:
                return ""
            if holder != leader:
                return "standby"
            p = s.kubectl.json("get", "pod", leader, "-n", s.system_namespace)
            return (
                "restarted leader"
                if p["status"]["containerStatuses"][0]["restartCount"] > restarts
                else ""
            )

        notes["takeover_by"] = wait_for(new_term, timeout=60, interval=0.5,
                                        what="a new leader (the standby or the restarted leader)")  # fmt: skip
        notes["takeover_s"] = round(time.monotonic() - start, 1)
        wait_for(
            lambda: not ({p["metadata"]["name"] for p in s.pods("worker")} & old)
            and s.replicas()[1] >= 1 and s.replicas()[0] == s.replicas()[1],
            timeout=300, interval=1, what="the rollout finished by the new leader",
        )  # fmt: skip
        return time.monotonic() - start

    result = _during(s, "operator leader killed mid-rollout", 3, act)
    result.notes.update(notes)
    return result


DEADLINE = 20  # the pool's progressDeadlineSeconds in stuck_rollout: short, to see it pass
FILLER = "node-filler"


def stuck_rollout(s: Scaling) -> Result:
    """A rollout whose surge pod does not fit: the node is full (a pod takes the CPU left),
    the old replica keeps serving. Status says so at each stage, while two clients send
    requests throughout:
    1. rolling: Ready=True RollingOut, Progressing=True Unschedulable (the scheduler's words);
    2. past the pool's progressDeadlineSeconds: Degraded=True ProgressDeadlineExceeded,
       Ready still True (serving on the old replica), Progressing=False;
    3. the node freed (the filler deleted): the rollout goes on and finishes by itself:
       Ready=True Ready, Progressing=False Complete, Degraded=False.
    The pool has a fixed replica here (an autoscaler's count would move with the load).
    `notes["stages"]`: each stage's conditions, as `kubectl describe` prints them."""
    fixed = resource(replicas=1, progressDeadlineSeconds=DEADLINE)
    fixed["spec"]["pools"][0].pop("autoscaling")
    s.apply(fixed)
    wait_for(lambda: _conditions(s, current=True)[:3] == [("True", "Ready"), ("False", "Complete"),
             ("False", "AsExpected")], timeout=300, interval=1, what="the fixed pool rolled out")  # fmt: skip
    stages: dict[str, list[str]] = {}

    def at(stage: str, want: list[tuple[str, str]], timeout: float) -> None:
        try:
            wait_for(lambda: _conditions(s, current=True)[:3] == want, timeout=timeout,
                     interval=1, what=f"stage {stage}: (Ready, Progressing, Degraded) = {want}")  # fmt: skip
        except AssertionError as e:
            raise AssertionError(f"{e}; now: {_conditions(s, current=False)}") from None
        stages[stage] = _describe(s)

    def act() -> float:
        old = {p["metadata"]["name"] for p in s.pods("worker")}
        _fill_node(s, old)
        try:
            rolled = resource(replicas=1, progressDeadlineSeconds=DEADLINE,
                              env=[{"name": "ROLLOUT", "value": str(time.time())}])  # fmt: skip
            rolled["spec"]["pools"][0].pop("autoscaling")
            start = time.monotonic()
            s.apply(rolled)
            at("rolling", [("True", "RollingOut"), ("True", "Unschedulable"),
                           ("False", "AsExpected")], timeout=60)  # fmt: skip
            at("past the deadline", [("True", "ProgressDeadlineExceeded"),
                                     ("False", "ProgressDeadlineExceeded"),
                                     ("True", "ProgressDeadlineExceeded")], timeout=DEADLINE + 90)  # fmt: skip
            assert {p["metadata"]["name"] for p in s.pods("worker") if _all_ready([p])} == old
        finally:
            s.kubectl("delete", "pod", FILLER, "-n", s.namespace, "--wait=false")
        at("node freed, rolled out", [("True", "Ready"), ("False", "Complete"),
                                      ("False", "AsExpected")], timeout=300)  # fmt: skip
        assert not ({p["metadata"]["name"] for p in s.pods("worker")} & old)
        return time.monotonic() - start

    result = _during(s, f"stuck rollout (full node, deadline {DEADLINE}s)", 2, act, s.duty)
    result.notes["stages"] = stages
    return result


AFTER_RESTART = 20.0  # seconds the load and the status watch go on once a daemon is back


def _node_daemon_restarted(s: Scaling, daemon: str) -> Result:
    """Restart the real node's kubelet or containerd under load; the window goes on until
    the node's kubelet has renewed its Lease since the restart and AFTER_RESTART seconds
    have passed (what a restarted kubelet does to its pods' probes, or a kubelet to a
    restarted runtime, shows in that time). Afterwards the node is Ready, status too, the
    frontend's pods are the same ones, and no pod restarted or failed. `notes["status"]`:
    what status said."""
    notes: dict[str, Any] = {}

    def act() -> float:
        before = {
            p["metadata"]["name"]: _restarts(p) for p in s.pods("worker") + s.pods("frontend")
        }
        _ready_again(s)  # status catches up with a pool the load just woke
        with StatusTimeline(s) as timeline:
            start, at = time.monotonic(), datetime.now(UTC)
            faults.restart_node_daemon(daemon)
            notes[f"{daemon}_back_s"] = round(time.monotonic() - start, 1)
            wait_for(lambda: _node_lease_renewed(s) > at, timeout=120, interval=0.5,
                     what=f"the kubelet renewing its node Lease since the {daemon} restart")  # fmt: skip
            notes["lease_renewed_after_s"] = round(time.monotonic() - start, 1)
            time.sleep(max(0.0, AFTER_RESTART - (time.monotonic() - start)))
            wait_for(lambda: _node_ready(s), timeout=120, interval=1, what="the node Ready again")
            _ready_again(s)
            settled = time.monotonic() - start
        pods = s.pods("worker") + s.pods("frontend")
        after = {p["metadata"]["name"]: _restarts(p) for p in pods}
        # The frontend has a fixed replica count; the pool's moves with the load (KEDA), so
        # its pods may come and go meanwhile: those kept must not have restarted, and no
        # pod may have failed (a kubelet rejecting pods it re-admits marks them Failed).
        frontend = f"{NAME}-frontend-"
        notes["frontends_kept"] = sorted(n for n in after if n.startswith(frontend)) == sorted(
            n for n in before if n.startswith(frontend)
        )
        notes["container_restarts"] = sum(after[n] - r for n, r in before.items() if n in after)
        notes["pods_failed"] = [
            p["metadata"]["name"]
            for p in pods
            if p["status"].get("phase") not in ("Running", "Pending")
        ]
        notes["status"] = timeline.lines
        return settled

    result = _during(s, f"{daemon} restarted", 2, act, s.duty)
    result.notes.update(notes)
    return result


def kubelet_restarted(s: Scaling) -> Result:
    return _node_daemon_restarted(s, "kubelet")


def containerd_restarted(s: Scaling) -> Result:
    return _node_daemon_restarted(s, "containerd")


def api_server_paused(s: Scaling, seconds: float = 60.0) -> Result:
    """SIGSTOP the API server for `seconds`, then SIGCONT: unlike a restart, connections
    stay open and hang. The frontend serves from the endpoints it knows; the operator's
    Lease cannot be renewed meanwhile. `notes["status"]`: what status said through it;
    `notes["paused"]`: the pause's (start, end), in time.monotonic()."""
    notes: dict[str, Any] = {}

    def act() -> float:
        _ready_again(s)  # status catches up with a pool the load just woke
        with StatusTimeline(s) as timeline:
            start = time.monotonic()
            with faults.api_server_frozen():
                time.sleep(seconds)
            notes["paused"] = (start, time.monotonic())  # monotonic, as the outcomes' times
            wait_for(testbed.cluster.is_up, timeout=120, interval=0.5, what="the API server back")
            wait_for(
                lambda: s.leader() != "", timeout=120, interval=1, what="an operator leading again"
            )
            _ready_again(s)
            settled = time.monotonic() - start
        notes["status"] = timeline.lines
        return settled

    result = _during(s, f"API server paused {seconds:.0f}s (SIGSTOP)", 2, act, s.duty)
    result.notes.update(notes)
    return result


NODE_FAULTS: list[Callable[[Scaling], Result]] = [
    kubelet_restarted,
    containerd_restarted,
    api_server_paused,
]

EVENTS: list[Callable[[Scaling], Result]] = [
    cold_start, ramp_up, scale_down, realtime_from_zero, pool_rollout, frontend_rollout, worker_killed,
    frontend_deleted, operator_leader_killed, api_server_restarted, *NODE_FAULTS, stuck_rollout,
]  # fmt: skip


# --------------------------------------------------------------------------- helpers


def _all_ready(pods: list[dict[str, Any]]) -> bool:
    """Every pod's containers ready (a pod not started yet has no statuses: not ready)."""
    return all(
        (statuses := p["status"].get("containerStatuses")) and all(c["ready"] for c in statuses)
        for p in pods
    )


def pod_states(pods: list[dict[str, Any]]) -> list[str]:
    """Each pod's name, phase and containers (ready, restarts, state): what a failed wait
    for pods reports."""
    out = []
    for p in pods:
        containers = []
        for c in p["status"].get("containerStatuses") or []:
            [(state, detail)] = (c.get("state") or {"unknown": {}}).items()
            why = detail.get("reason") or detail.get("exitCode") or ""
            containers.append(f"ready={c['ready']} restarts={c['restartCount']} {state} {why}")
        out.append(f"{p['metadata']['name']} {p['status'].get('phase')} [{'; '.join(containers)}]")
    return out


def _a_ready_pod(s: Scaling, component: str) -> dict[str, Any]:
    """A pod of the component whose containers are all ready (the load may just have added
    one that has not started yet)."""
    pods: list[dict[str, Any]] = wait_for(
        lambda: [p for p in s.pods(component) if _all_ready([p])],
        timeout=120, interval=1, what=f"a ready {component} pod",
    )  # fmt: skip
    return pods[0]


def _restarts(pod: dict[str, Any]) -> int:
    return sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses") or [])


def _node_lease_renewed(s: Scaling) -> datetime:
    """When the real node's kubelet last renewed its Lease (kube-node-lease)."""
    out = s.kubectl.run("get", "lease", testbed.realnode.NODE_NAME, "-n", "kube-node-lease",
                        "-o", "json", check=False)  # fmt: skip
    renewed = json.loads(out.stdout)["spec"].get("renewTime") if not out.returncode else None
    return datetime.fromisoformat(renewed) if renewed else datetime.min.replace(tzinfo=UTC)


def _node_ready(s: Scaling) -> bool:
    node = s.kubectl.json("get", "node", testbed.realnode.NODE_NAME)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


CONDITIONS = ("Ready", "Progressing", "Degraded")


def _conditions(s: Scaling, current: bool) -> list[tuple[str, str]]:
    """(status, reason) of Ready, Progressing and Degraded; [] while the status is not for
    the current generation and `current` is asked."""
    td = td_get(s.kubectl, s.namespace, NAME)
    if (
        current
        and (td.get("status") or {}).get("observedGeneration") != td["metadata"]["generation"]
    ):
        return []
    found = [condition(td, t) for t in CONDITIONS]
    return [(c.get("status", "?"), c.get("reason", "?")) for c in found]


def _describe(s: Scaling) -> list[str]:
    """The conditions as a user reads them: 'Ready=True RollingOut: serving ...'."""
    td = td_get(s.kubectl, s.namespace, NAME)
    return [f"{t}={c.get('status')} {c.get('reason')}: {c.get('message', '')}"
            for t in CONDITIONS if (c := condition(td, t))]  # fmt: skip


def _millicores(cpu: str) -> int:
    return round(quantity(cpu) * 1000)


def _fill_node(s: Scaling, on_node_of: set[str]) -> None:
    """A pod (the sandbox image, doing nothing) requesting all the CPU still free on the
    node the pool's pods run on, so that no more of them fits; once it runs."""
    pod = s.kubectl.json("get", "pod", sorted(on_node_of)[0], "-n", s.namespace)
    node_name = pod["spec"]["nodeName"]
    node = s.kubectl.json("get", "node", node_name)

    def settled() -> dict[str, Any] | None:
        """The node's pods, once none is terminating: a pod on its way out still holds its
        request, and would free it after the filler took the rest (a rollout just before,
        another suite's namespace going)."""
        found: dict[str, Any] = s.kubectl.json("get", "pods", "-A", "--field-selector",
            f"spec.nodeName={node_name},status.phase!=Succeeded,status.phase!=Failed")  # fmt: skip
        gone = [p for p in found["items"] if p["metadata"].get("deletionTimestamp")]
        return None if gone else found

    pods = wait_for(settled, timeout=300, interval=2, what=f"no pod terminating on {node_name}")
    used = sum(
        _millicores(c.get("resources", {}).get("requests", {}).get("cpu", "0"))
        for p in pods["items"] for c in p["spec"]["containers"]
    )  # fmt: skip
    free = _millicores(node["status"]["allocatable"]["cpu"]) - used
    assert free >= 0, f"node {node_name}: {used}m of CPU requested already"
    s.kubectl.apply({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": FILLER},
        "spec": {
            "nodeName": node_name, "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "filler", "image": images.refs()["pause"], "imagePullPolicy": "Never",
                "resources": {"requests": {"cpu": f"{free}m", "memory": "8Mi"},
                              "limits": {"memory": "8Mi"}},
                "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                                    "runAsUser": 65535, "capabilities": {"drop": ["ALL"]},
                                    "seccompProfile": {"type": "RuntimeDefault"}},
            }],
        },
    }, s.namespace)  # fmt: skip
    wait_for(lambda: s.kubectl.json("get", "pod", FILLER, "-n", s.namespace)["status"].get("phase") == "Running",
             timeout=60, interval=1, what=f"the filler pod ({free}m CPU) running")  # fmt: skip
