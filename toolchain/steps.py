"""Where a long command's time goes, and how much of it is left.

Each step of a first run (a Go build, an image, a Python environment, a test suite) records
how long it took and whether it did its work or found it cached, and `make test`'s own steps
how busy they kept the CPUs (the whole machine's, from /proc/stat: the test bed's daemons
and pods count too). The next run's progress
lines estimate what is left from those times (`estimate`), or, on a machine that never ran
one, from the times measured on a fresh 2-core machine (`TYPICAL`). `make test` starts a
record (`begin`), times its own steps (`run`) and prints the record at its end (`report`),
also when a step fails.

    python -m toolchain.steps begin                    start this run's record
    python -m toolchain.steps run NAME -- COMMAND...   run a step, timed; the record on failure
    python -m toolchain.steps together NAME -- COMMAND... [:: NAME -- COMMAND...]...
                                                       the first step, with the others one
                                                       after another beside it (`together`)
    python -m toolchain.steps record NAME SECONDS      record a build a recipe timed itself
    python -m toolchain.steps end                      print this run's record; it ends
    python -m toolchain.steps report                   print it (or the last run's)

Only the standard library is used: the Makefile runs it before the virtual environment exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

HERE = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    / "transcription-operator"
    / "steps"
)
RUN = HERE / "run.jsonl"  # this run's steps, one JSON object a line
DONE = HERE / "last-run.jsonl"  # the last run's, once reported
LAST = HERE / "last.json"  # each step's time the last time it did its work

# Seconds each step took on a fresh 2-core machine with empty caches (the cold `make test`
# of 2026-12-02, issue 36; KEDA, CoreDNS and promtool as their builds took after the
# aligned wrappers' first builds, toolchain.align, and the torch images with uv, on
# 2026-12-06; Flux's trimmed build, toolchain/flux.py, scaled from it by its cold builds
# side by side, 116 s against 217; every Go build then scaled by its own time without DWARF or
# inlining, toolchain.GC_FLAGS, over its time before, in two cold runs on one machine, 0.61
# to 0.81): the estimate before this machine has times of its own.
TYPICAL: dict[str, float] = {
    "go kubernetes": 445, "go keda": 106, "go flux": 55, "go kube-router": 75,
    "go kwok": 65, "go prometheus": 32, "go helm": 56, "go coredns": 9,
    "go containerd": 48, "go etcd": 32, "go actionlint": 2,
    "image base": 166, "image frontend": 138, "image operator": 79, "image worker-cpu": 69,
    "image torch": 88, "image worker-transformers": 47, "image worker-vllm-cpu": 129,
}  # fmt: skip


SLOWEST = 12  # test modules the report lists
# The steps run beside another (`together`) run at this lower priority: they take the CPU
# time the other leaves idle (the e2e suite waits on pods, leases and faults: 49 % of the
# 2 CPUs idle) and little of what it would use.
BESIDE_NICE = 10
LOGS = HERE / "logs"  # the output of the steps run beside another, one file each


def _last() -> dict[str, float]:
    try:
        return {k: float(v) for k, v in json.loads(LAST.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def expected(name: str) -> tuple[float, str] | None:
    """What step `name` should take, and where that figure comes from; None if unknown."""
    if (seconds := _last().get(name)) is not None:
        return seconds, "last time"
    if name in TYPICAL:
        return TYPICAL[name], "on a fresh 2-core machine"
    return None


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def estimate(name: str, elapsed: float | None = None) -> str:
    """'about 10 min (last time)', or with `elapsed`: 'about 4 min left of 10 min (last
    time)'; '' when nothing is known of the step."""
    known = expected(name)
    if known is None:
        return ""
    seconds, source = known
    if elapsed is None:
        return f"about {_minutes(seconds)} ({source})"
    left = seconds - elapsed
    if left <= 0:
        return f"longer than {_minutes(seconds)} {source}"
    return f"about {_minutes(left)} left of {_minutes(seconds)} ({source})"


def total(names: list[str]) -> str:
    """'about 19 min in all (...)' for steps still to do, '' if any is unknown."""
    known = [expected(n) for n in names]
    if not names or any(k is None for k in known):
        return ""
    return f"about {_minutes(sum(k[0] for k in known if k))} in all"


# The run a process belongs to: `make test` sets it for every command it starts, so that
# another command (a `make -n test`, a `pytest` in another checkout) can neither add to
# this run's record nor end it.
RUN_ENV = "STEPS_RUN"


def _run_id() -> str:
    return os.environ.get(RUN_ENV, "")


def _ours() -> bool:
    """A run began (`begin`), and it is this process's run."""
    try:
        with RUN.open() as f:
            first = json.loads(f.readline())
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and first.get("run", "") == _run_id()


def record(
    name: str, seconds: float, state: str = "built", kind: str = "build", busy: float | None = None
) -> None:
    """Note a step in this run's record (`kind`: "make" for make's own steps, "build" for
    the builds inside them; `busy`: the CPUs' busy share while it ran); a step that did its
    work also sets its estimate."""
    try:
        HERE.mkdir(parents=True, exist_ok=True)
        if _ours():  # this process's run began (`make test`); others set estimates only
            entry = {"step": name, "seconds": round(seconds, 1), "state": state, "kind": kind,
                     "at": time.time()}  # fmt: skip
            if busy is not None:
                entry["busy"] = round(busy, 3)
            with RUN.open("a") as f:
                f.write(json.dumps(entry) + "\n")
        if state in ("built", "done", "ran"):  # not when cached or failed
            last = _last()
            last[name] = round(seconds, 1)
            tmp = LAST.with_suffix(f".{os.getpid()}")
            tmp.write_text(json.dumps(last, indent=1, sort_keys=True))
            tmp.replace(LAST)
    except OSError as e:  # a record is never worth failing a build for
        print(f"[steps] not recorded ({e})", file=sys.stderr)


# /proc/stat's first line: the CPU time of every CPU since boot, in clock ticks, by kind.
PROC_STAT = Path("/proc/stat")
_IDLE = (3, 4)  # idle, iowait: the CPUs had nothing to run


def cpu_times() -> tuple[float, float] | None:
    """The machine's CPU time since boot, in CPU-seconds: (busy, busy and idle); None where
    /proc/stat cannot be read."""
    try:
        fields = PROC_STAT.read_text().splitlines()[0].split()
        ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, IndexError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    idle = sum(ticks[i] for i in _IDLE)
    return (sum(ticks) - idle) / hz, sum(ticks) / hz


def busy_share(before: object, after: object) -> float | None:
    """The share of the CPUs' time that was busy between two `cpu_times` (None without
    both, or with no time between them)."""
    if not (isinstance(before, list | tuple) and isinstance(after, list | tuple)):
        return None
    total = float(after[1]) - float(before[1])
    return (float(after[0]) - float(before[0])) / total if total > 0 else None


def begin() -> None:
    """A new run's record, for the commands that carry its ID (`RUN_ENV`)."""
    HERE.mkdir(parents=True, exist_ok=True)
    RUN.write_text(json.dumps({"begin": time.time(), "run": _run_id(), "cpu": cpu_times()}) + "\n")


@dataclass
class Record:
    """A run's record: its start (None without `begin`), its end (None while it runs), the
    machine's `cpu_times` at each, and its steps in order."""

    start: float | None = None
    stop: float | None = None
    cpu_start: object = None  # `cpu_times` at the start, as the record holds it
    cpu_stop: object = None
    done: list[dict[str, object]] = field(default_factory=list)


def steps() -> Record:
    """This run's record (the last run's once it has ended)."""
    out = Record()
    try:
        lines = (RUN if RUN.exists() else DONE).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if "begin" in entry:
            out.start, out.cpu_start = float(entry["begin"]), entry.get("cpu")
        elif "end" in entry:
            out.stop, out.cpu_stop = float(entry["end"]), entry.get("cpu")
        else:
            out.done.append(entry)
    return out


def report(out: TextIO | None = None) -> str:
    """This run's steps: make's own in order, then the builds inside them, slowest first,
    then the wall time since `begin` and how busy the CPUs were."""
    rec = steps()
    start, stop, done = rec.start, rec.stop, rec.done
    if not done:
        return ""
    width = max(len(str(s["step"])) for s in done) + 2
    make = [s for s in done if s.get("kind") == "make"]
    # A build is asked for by every command that needs it: once built, later asks find it
    # cached. Each build once: its time where it did its work, else one "cached".
    builds: dict[str, dict[str, object]] = {}
    for s in done:
        if s.get("kind") == "build" and (s["step"] not in builds or s["state"] != "cached"):
            builds[str(s["step"])] = s
    inner = sorted((s for s in builds.values() if s["state"] != "cached"), key=lambda s: -_secs(s))
    cached = [name for name, s in builds.items() if s["state"] == "cached"]
    suites = sorted((s for s in done if s.get("kind") == "suite"), key=lambda s: -_secs(s))
    lines = ["", "Where this run's time went:"]
    for title, group in [("make's steps, in order:", make),
                         ("the builds inside them, slowest first:", inner),
                         ("the slowest test modules (fixtures' set-up included):",
                          suites[:SLOWEST])]:  # fmt: skip
        if group:
            lines.append(f"  {title}")
            lines += [f"    {s['step']!s:<{width}}{_secs(s):7.0f} s  {s['state']}{_busy(s)}"
                      for s in group]  # fmt: skip
        if group is inner and cached:
            lines.append(f"  found cached: {', '.join(cached)}")
    if start is not None:
        wall = (stop or time.time()) - start
        lines.append(f"  wall time from the start: {wall:.0f} s ({wall / 60:.1f} min)")
        share = busy_share(rec.cpu_start, rec.cpu_stop if stop else cpu_times())
        if share is not None:
            lines.append(f"  the CPUs were busy {share:.0%} of it (idle {1 - share:.0%})")
    text = "\n".join(lines)
    print(text, file=out or sys.stdout, flush=True)
    return text


def _secs(step: dict[str, object]) -> float:
    return float(str(step["seconds"]))


def _busy(step: dict[str, object]) -> str:
    busy = step.get("busy")
    return f"  (CPUs {float(str(busy)):.0%} busy)" if busy is not None else ""


def end() -> None:
    """The run is over: its record is printed and kept as the last run's (another run's
    record is left to that run)."""
    if _ours():
        with RUN.open("a") as f:
            f.write(json.dumps({"end": time.time(), "cpu": cpu_times()}) + "\n")
        RUN.replace(DONE)
    report()


def _timed(name: str, command: list[str], out: BinaryIO | None = None) -> tuple[int, str, float]:
    """Run a step of make's (its output to `out`, else shown) and record it: its exit
    status, its state and its seconds."""
    start, cpu = time.monotonic(), cpu_times()
    rc = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT if out else None)
    seconds, state = time.monotonic() - start, "done" if rc == 0 else f"failed ({rc})"
    record(name, seconds, state, "make", busy_share(cpu, cpu_times()))
    return rc, state, seconds


def run(name: str, command: list[str]) -> int:
    """Run a step of make's, timed; its exit status. On failure, the run ends there."""
    rc = _timed(name, command)[0]
    if rc:
        end()
    return rc


Step = tuple[str, list[str]]  # a step's name and its command


def together(first: Step, beside: list[Step]) -> int:
    """Run step `first`, its output shown as it comes, and the `beside` steps one after
    another at the same time, each at the lower priority `BESIDE_NICE` with its output kept
    in `LOGS` and printed once `first` has ended (a line says when each ends). Every step is
    recorded; the result is the first failed step's exit status (0: none failed), and on a
    failure the run ends there, its record printed."""
    LOGS.mkdir(parents=True, exist_ok=True)
    logs = [LOGS / f"{i}.log" for i in range(len(beside))]
    codes = [0] * len(beside)

    def chain() -> None:
        for i, ((name, command), log) in enumerate(zip(beside, logs, strict=True)):
            with log.open("wb") as out:
                codes[i], state, seconds = _timed(f"{name} (beside the {first[0]})",
                                                  ["nice", "-n", str(BESIDE_NICE), *command], out)  # fmt: skip
            print(f"\n[{name}, beside the {first[0]}: {state} in {seconds:.0f} s; its output "
                  f"follows the {first[0]}'s]", flush=True)  # fmt: skip

    worker = threading.Thread(target=chain, name="beside")
    worker.start()
    rc = _timed(*first)[0]
    worker.join()
    for (name, _), log, code in zip(beside, logs, codes, strict=True):
        print(f"\n==> {name} (beside the {first[0]}), exit status {code}:", flush=True)
        sys.stdout.buffer.write(log.read_bytes())
        sys.stdout.flush()
    failed = [code for code in [rc, *codes] if code]
    if failed:
        end()
    return failed[0] if failed else 0


def _steps(args: list[str]) -> list[Step] | None:
    """`NAME -- COMMAND... [:: NAME -- COMMAND...]...` as steps; None if malformed."""
    out: list[Step] = []
    chunk: list[str] = []
    for arg in [*args, "::"]:
        if arg != "::":
            chunk.append(arg)
            continue
        if len(chunk) < 3 or chunk[1] != "--":
            return None
        out.append((chunk[0], chunk[2:]))
        chunk = []
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["begin"]:
        begin()
    elif argv[:1] == ["report"]:
        report()
    elif argv[:1] == ["end"]:
        end()
    elif argv[:1] == ["record"] and len(argv) == 3:
        record(argv[1], float(argv[2]))  # an environment or packages, inside make's steps
    elif argv[:1] == ["run"] and len(argv) > 3 and argv[2] == "--":
        return run(argv[1], argv[3:])
    elif argv[:1] == ["together"] and (parsed := _steps(argv[1:])):
        return together(parsed[0], parsed[1:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
