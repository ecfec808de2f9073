"""Outbound traffic of the project's processes, observed without LD_PRELOAD or privileges:
what a child process looks up, or would fetch, is logged so that a test can assert that it
reaches nothing but loopback.

Two observers, given to a child through its environment (`Watch.env`):
- a `sitecustomize` module on its PYTHONPATH, which wraps the `socket` module's lookups
  (`getaddrinfo`, `gethostbyname`, `gethostbyname_ex`) and appends each name to a log:
  Python code that resolves through `socket` (httpx, requests, urllib, asyncio's own loop);
- a sink that plays the HTTP(S) proxy (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, loopback
  excepted by `NO_PROXY`), which records each request's target and closes: any HTTP client
  that honours the proxy variables, native ones too (onnxruntime's telemetry is libcurl's,
  which resolves in C, out of the wrapper's sight), tells the sink the host it wanted
  instead of looking it up.

Out of both observers' sight: native code that resolves names itself and ignores the proxy
variables (uvloop's resolver, used for names that are not IP literals).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", ""})


def loopback(name: str) -> bool:
    """Whether a looked-up name is this machine: `localhost` or a loopback address."""
    try:
        return name in LOOPBACK_NAMES or ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


SITECUSTOMIZE = '''\
"""Test harness (testkit.egress): log every name this process looks up through `socket`."""
import os
import socket

_LOG = os.environ.get("EGRESS_LOG")


def _logged(real):
    def lookup(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else str(host if host is not None else "")
        with open(_LOG, "a") as f:
            f.write(name + "\\n")
        return real(host, *args, **kwargs)

    return lookup


if _LOG:
    for _name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex"):
        setattr(socket, _name, _logged(getattr(socket, _name)))
    with open(_LOG, "a") as f:  # this process is watched
        f.write(f"# {os.getpid()}\\n")
'''


@dataclass
class Sink:
    """A TCP listener on loopback that records the first line each client sends (a proxied
    request: `CONNECT host:443 HTTP/1.1`, `GET http://host/... HTTP/1.1`) and hangs up."""

    requests: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    line = conn.recv(4096).split(b"\r\n", 1)[0]
                except OSError:
                    continue
                self.requests.append(line.decode("latin-1"))

    def close(self) -> None:
        self.listener.close()


class Watch:
    """The observers for child processes: `env` to start them with, then `lookups()` (names
    looked up) and `sink.requests` (requests that would have left)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory / "egress"
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.log = self.directory / "lookups.log"
        self.log.touch()
        self.sink = Sink()

    @property
    def env(self) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(self.directory), os.environ.get("PYTHONPATH")) if p)
        proxy = {k: self.sink.url for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")}
        no_proxy = {"NO_PROXY": "localhost,127.0.0.1,::1"}
        every = {**proxy, **no_proxy}
        return {"PYTHONPATH": path, "EGRESS_LOG": str(self.log), **every,
                **{k.lower(): v for k, v in every.items()}}  # fmt: skip

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def lookups(self) -> list[str]:
        """The names looked up, by every watched process."""
        return [n for n in self.lines() if not n.startswith("# ")]

    def watched(self) -> set[int]:
        """The processes the lookup wrapper was loaded in."""
        return {int(n[2:]) for n in self.lines() if n.startswith("# ")}

    def outside(self) -> list[str]:
        """Every name looked up that is not loopback, and every request that reached the sink."""
        return [n for n in self.lookups() if not loopback(n)] + self.sink.requests

    def close(self) -> None:
        self.sink.close()
