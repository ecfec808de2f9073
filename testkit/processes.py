"""The project's processes started as a pod would start them, for suites against real
engines: wait for a health URL, the frontend on a route table, stop one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from testkit.host import free_port
from transcription_api.frontend import SETTINGS_ENV, FrontendSettings
from transcription_api.routes import Routes, RouteTable

BIN = Path(sys.executable).parent


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready in {timeout}s:\n{log.read_text()[-3000:]}")


def start(args: list[str], log: Path, url: str, cwd: Path | None = None,
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=cwd, env={**os.environ, **(env or {})},
                                stdout=out, stderr=out)  # fmt: skip
    wait_http(url, proc, log)
    return proc


def stop(proc: subprocess.Popen[Any], grace: float = 15) -> None:
    """SIGTERM, then SIGKILL if it is still running after `grace` seconds; reaped."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def local_settings(port: int, **settings: Any) -> FrontendSettings:
    """A frontend's settings on 127.0.0.1:`port` with no scaler and no internal port (on
    their fixed ports, processes side by side would collide), `settings` over them."""
    local = {"host": "127.0.0.1", "port": port, "scaler_port": None, "internal_port": None}
    return FrontendSettings(**{**local, **settings})


def frontend(table: RouteTable | Routes, d: Path, args: list[str] | None = None, ready: str = "/ready",
             env: dict[str, str] | None = None, **settings: Any,
             ) -> tuple[str, subprocess.Popen[bytes]]:  # fmt: skip
    """The frontend's process on `table`, with `settings` (fields of `FrontendSettings`, in
    its environment variable as the operator passes them), more command-line `args` and
    more `env`, once `ready` (a path) answers 200."""
    (d / "routes.json").write_text(table.dumps())
    port = free_port()
    env = {**(env or {}), SETTINGS_ENV: local_settings(port, **settings).to_env()}
    proc = start([str(BIN / "transcription-frontend"), "--routes", str(d / "routes.json"), *(args or [])],
                 d / "frontend.log", f"http://127.0.0.1:{port}{ready}", env=env)  # fmt: skip
    return f"http://127.0.0.1:{port}", proc


def with_endpoints(table: RouteTable, urls: dict[str, str]) -> RouteTable:
    pools = [p.model_copy(update={"endpoints": [urls[p.name]]}) for p in table.pools]
    return table.model_copy(update={"pools": pools})
