"""Helpers shared by the benchmarks: processes, /proc readings, tables and JSON."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx

import toolchain
from testkit import host, processes

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench-results"
PY = sys.executable


say = partial(toolchain.say, who="bench")
T = TypeVar("T")


class Proc:
    """A child process with an HTTP health URL, and readings of its CPU and memory."""

    def __init__(
        self, args: list[str], health: str, name: str, env: dict[str, str] | None = None
    ) -> None:
        RESULTS.mkdir(exist_ok=True)
        self.log = open(RESULTS / f"{name}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            args, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        self.name = name
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{name} exited; see {RESULTS / (name + '.log')}")
            try:
                with urllib.request.urlopen(health, timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise SystemExit(f"{name} did not become healthy")

    def log_size(self) -> int:
        self.log.flush()
        return (RESULTS / f"{self.name}.log").stat().st_size

    def log_since(self, offset: int) -> str:
        """What the process logged after `offset` bytes."""
        with (RESULTS / f"{self.name}.log").open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def rss_kib(self) -> int:
        return host.status_kib(self.proc.pid, "VmRSS")

    def peak_kib(self) -> int:
        return host.status_kib(self.proc.pid, "VmHWM")

    def reset_peak(self) -> None:
        """Reset VmHWM to the current RSS (Linux: write 5 to clear_refs)."""
        with contextlib.suppress(OSError):
            Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")

    def peak_during(self, during: Callable[[], T]) -> tuple[T, int, int]:
        """`during()`'s result, and this process's RSS (KiB) before it and at its peak
        meanwhile (VmHWM, reset first, and samples every 10 ms)."""
        before = self.rss_kib()
        self.reset_peak()
        samples = [before]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append(self.rss_kib())
                time.sleep(0.01)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            result = during()
        finally:
            stop.set()
            sampler.join()
        return result, before, max(max(samples), self.peak_kib())

    def cpu_seconds(self) -> float:
        return host.cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        processes.stop(self.proc)
        self.log.close()


def frontend_proc(route_file: Path, port: int, name: str, **settings: Any) -> Proc:
    """The frontend's process on `route_file`, on 127.0.0.1:`port` with no scaler and no
    internal port, `settings` (fields of `FrontendSettings`) over those."""
    from testkit.processes import local_settings
    from transcription_api.frontend import SETTINGS_ENV

    env = {SETTINGS_ENV: local_settings(port, **settings).to_env()}
    return Proc([PY, "-m", "transcription_frontend.main", "--routes", str(route_file),
                 "--log-level", "warning"], f"http://127.0.0.1:{port}/health", name, env=env)  # fmt: skip


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    cells = [header, *[[_fmt(c) for c in r] for r in rows]]
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, r in enumerate(cells):
        print("  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def write(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    say(f"wrote {path}")
    return path


LIMIT_MIB = 512  # spec.frontend.resources' default memory limit


def refusal(r: httpx.Response) -> str:
    try:
        code = r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = "not OpenAI's shape"
    retry = "Retry-After" if "retry-after" in r.headers else "no Retry-After"
    return f"{r.status_code} {code}, {retry}"


def sampled(fe: Proc, during: Callable[[], T]) -> tuple[T, dict[str, float]]:
    """`during()`'s result, and the frontend's RSS (MiB) before, at peak and after it."""
    result, before, peak = fe.peak_during(during)
    rss = {"rss_before_mib": before / 1024, "rss_peak_mib": peak / 1024,
           "rss_after_mib": fe.rss_kib() / 1024}  # fmt: skip
    return result, rss
