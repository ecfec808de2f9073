"""GitOps in the test bed: Flux's controllers, and a Git repository for them to follow.

- **A Git server.** Bare repositories under a directory, served read-only over Git's smart
  HTTP protocol by Git's own CGI program, ``git http-backend``, behind a small
  ``ThreadingHTTPServer`` on 127.0.0.1 (a thread of the process that starts it: the test).
  source-controller clones them with go-git as it clones any HTTP remote. A test writes
  through :class:`Repository`: a work tree whose commits it pushes to the bare repository
  on disk; nothing is pushed over HTTP (``http-backend`` refuses anonymous pushes).
- **Flux.** source-controller and kustomize-controller, built from the pinned modules
  (the ``FLUX`` tool of ``toolchain``), run as host processes with
  the test bed's admin kubeconfig, as the control plane's components do: leader election
  off, every namespace watched, every port on 127.0.0.1 and free when they start.
  kustomize-controller downloads each revision from source-controller's artifact server
  (``--storage-addr``), at the address source-controller advertises in the
  GitRepository's status (``--storage-adv-addr``). Their PID files and logs are under
  ``$TESTBED_CACHE/flux``; ``stop`` (and the test bed's ``down``) ends them. Only the tests
  that need them start them (``cluster.flux()``), never ``up``.

Only the standard library is used (with ``testkit.host``, which uses nothing else), like
cluster.py.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from testkit.host import alive, argv, free_port, pids

CONTROLLERS = ("source-controller", "kustomize-controller")
# The kinds whose objects carry Flux's finalizers: deleted while the controllers still run.
KINDS = ("kustomizations.kustomize.toolkit.fluxcd.io", "gitrepositories.source.toolkit.fluxcd.io")
BRANCH = "main"

# --------------------------------------------------------------------------- Git over HTTP


def cgi_environ(
    method: str, path: str, query: str, headers: Mapping[str, str], root: Path, remote: str
) -> dict[str, str]:
    """The CGI variables `git http-backend` reads (RFC 3875, plus GIT_PROJECT_ROOT): every
    request header as HTTP_*, as a web server passes them (Git-Protocol, for one, selects
    protocol v2; Content-Encoding a gzipped request body)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_PROJECT_ROOT": str(root),
        "GIT_HTTP_EXPORT_ALL": "1",  # no git-daemon-export-ok file needed
        "GATEWAY_INTERFACE": "CGI/1.1",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "REMOTE_ADDR": remote,
    }
    for key, value in headers.items():
        name = key.upper().replace("-", "_")
        if name == "CONTENT_TYPE":
            env["CONTENT_TYPE"] = value
        elif name == "CONTENT_LENGTH":
            env["CONTENT_LENGTH"] = value
        else:
            env[f"HTTP_{name}"] = value
    return env


def parse_cgi(output: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    """A CGI program's output: status (its Status header, else 200), headers, body."""
    for sep in (b"\r\n\r\n", b"\n\n"):
        head, found, body = output.partition(sep)
        if found:
            break
    else:
        return 502, [], output
    status = 200
    headers = []
    for line in head.decode("latin-1").splitlines():
        key, _, value = line.partition(":")
        if key.lower() == "status":
            status = int(value.split()[0])
        else:
            headers.append((key.strip(), value.strip()))
    return status, headers, body


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self._backend()

    def do_POST(self) -> None:
        self._backend()

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _backend(self) -> None:
        path, _, query = self.path.partition("?")
        body = self._body() if self.command == "POST" else b""
        headers = {k: v for k, v in self.headers.items() if k.lower() != "transfer-encoding"}
        if self.command == "POST":
            headers["Content-Length"] = str(len(body))
        env = cgi_environ(self.command, path, query, headers, self.server.root,
                          self.client_address[0])  # fmt: skip
        proc = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True)
        status, out_headers, out = parse_cgi(proc.stdout)
        if proc.returncode and status == 200:
            status, out = 500, proc.stderr
        self.send_response(status)
        for key, value in out_headers:
            if key.lower() != "content-length":
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, format: str, *args: object) -> None:
        self.server.requests.append(
            f"{self.command} {self.path} -> {args[1] if len(args) > 1 else ''}"
        )


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = root
        self.requests: list[str] = []


class GitServer:
    """The bare repositories under `root`, served read-only at ``url(name)`` while open."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GitServer:
        self.root.mkdir(parents=True, exist_ok=True)
        self._server = _Server(self.root)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
        if self._thread:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    @property
    def port(self) -> int:
        assert self._server, "the Git server is not running"
        return int(self._server.server_address[1])

    @property
    def requests(self) -> list[str]:
        """'GET /fleet.git/info/refs?service=git-upload-pack -> 200', one per request."""
        return list(self._server.requests) if self._server else []

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}.git"

    def repository(self, name: str) -> Repository:
        return Repository(self.root / f"{name}.git", self.root.parent / f".{name}-work")


def git(*args: str, cwd: Path | None = None) -> str:
    """git, with no configuration of the user's or the system's and a fixed author."""
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "testbed",
        "GIT_AUTHOR_EMAIL": "testbed@transcription.dev",
        "GIT_COMMITTER_NAME": "testbed",
        "GIT_COMMITTER_EMAIL": "testbed@transcription.dev",
    }
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


class Repository:
    """A bare repository (what the server serves) and the work tree commits are made in."""

    def __init__(self, bare: Path, work: Path) -> None:
        self.bare = bare
        self.work = work
        if not bare.exists():
            git("init", "--quiet", "--bare", f"--initial-branch={BRANCH}", str(bare))
        if not work.exists():
            git("init", "--quiet", f"--initial-branch={BRANCH}", str(work))
            git("remote", "add", "origin", str(bare), cwd=work)

    def commit(self, files: Mapping[str, str], message: str) -> str:
        """Make the tree exactly `files` (path -> text), commit and push it; return the
        commit's SHA-1."""
        for entry in self.work.iterdir():
            if entry.name != ".git":
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        for rel, text in files.items():
            path = self.work / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        git("add", "--all", cwd=self.work)
        git("commit", "--quiet", "--allow-empty", "-m", message, cwd=self.work)
        git("push", "--quiet", "origin", f"HEAD:refs/heads/{BRANCH}", cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work).strip()


# --------------------------------------------------------------------------- Flux


@dataclass(frozen=True)
class Ports:
    storage: int
    source_metrics: int
    source_health: int
    kustomize_metrics: int
    kustomize_health: int

    @classmethod
    def free(cls) -> Ports:
        return cls(*(free_port() for _ in range(5)))


def flux_dir(cache: Path) -> Path:
    return cache / "flux"


def commands(binary: Callable[[str], Path], storage: Path, ports: Ports) -> dict[str, list[str]]:
    """The controllers' command lines."""
    local = "127.0.0.1"
    common = ["--enable-leader-election=false", "--watch-all-namespaces=true",
              "--log-level=info", "--log-encoding=console"]  # fmt: skip
    return {
        "source-controller": [
            str(binary("source-controller")),
            f"--storage-path={storage}",
            f"--storage-addr={local}:{ports.storage}",
            f"--storage-adv-addr={local}:{ports.storage}",
            f"--metrics-addr={local}:{ports.source_metrics}",
            f"--health-addr={local}:{ports.source_health}",
            *common,
        ],
        "kustomize-controller": [
            str(binary("kustomize-controller")),
            f"--metrics-addr={local}:{ports.kustomize_metrics}",
            f"--health-addr={local}:{ports.kustomize_health}",
            "--no-remote-bases=true",  # everything comes from the test bed's repository
            *common,
        ],
    }


@dataclass(frozen=True)
class Flux:
    """The running controllers: where their logs are, and their ports."""

    dir: Path
    ports: Ports

    def log(self, name: str) -> Path:
        return self.dir / "logs" / f"{name}.log"

    def logs(self, lines: int = 40) -> str:
        """The last lines of each controller's log (for a failing test's message)."""
        out = []
        for name in CONTROLLERS:
            with contextlib.suppress(OSError):
                tail = self.log(name).read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {name} ({self.log(name)})\n" + "\n".join(tail))
        return "\n".join(out)


def start(
    cache: Path, kubeconfig: Path, binary: Callable[[str], Path], timeout: float = 90
) -> Flux:
    """Start both controllers (after stopping any an earlier run left); return once both
    answer their readiness probes."""
    stop(cache)
    d = flux_dir(cache)
    (d / "logs").mkdir(parents=True, exist_ok=True)
    storage = d / "storage"
    storage.mkdir(parents=True, exist_ok=True)
    ports = Ports.free()
    flux = Flux(d, ports)
    procs = _children
    for name, cmd in commands(binary, storage, ports).items():
        with open(flux.log(name), "wb") as log:
            procs[name] = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "KUBECONFIG": str(kubeconfig)},
            )  # fmt: skip
        (d / f"{name}.pid").write_text(str(procs[name].pid))
    health = {"source-controller": ports.source_health,
              "kustomize-controller": ports.kustomize_health}  # fmt: skip
    deadline = time.monotonic() + timeout
    waiting = set(CONTROLLERS)
    while waiting:
        for name in sorted(waiting):
            if procs[name].poll() is not None:
                stop(cache)
                raise RuntimeError(f"{name} exited ({procs[name].returncode})\n{flux.logs()}")
            if _ready(health[name]):
                waiting.discard(name)
        if waiting and time.monotonic() > deadline:
            stop(cache)
            raise RuntimeError(
                f"{', '.join(sorted(waiting))} not ready in {timeout:.0f}s\n{flux.logs()}"
            )
        time.sleep(0.5)
    return flux


# The controllers this process started, reaped by `stop`.
_children: dict[str, subprocess.Popen[bytes]] = {}


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def stop(cache: Path, grace: float = 15.0) -> None:
    """Stop the controllers this cache directory's PID files name (SIGTERM, then SIGKILL),
    and any other left running from it; remove their artifact storage. The logs stay."""
    d = flux_dir(cache)
    stopping = set(leftovers(cache))
    for name in CONTROLLERS:
        with contextlib.suppress(OSError, ValueError):
            pid = int((d / f"{name}.pid").read_text())
            if name in " ".join(argv(pid)):
                stopping.add(pid)
        (d / f"{name}.pid").unlink(missing_ok=True)
    for pid in stopping:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (running := [p for p in stopping if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for proc in _children.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    _children.clear()
    shutil.rmtree(d / "storage", ignore_errors=True)


def leftovers(cache: Path) -> dict[int, str]:
    """Flux controllers running from a binary under the test bed's cache, by PID."""
    found = {}
    for pid in pids():
        args = argv(pid)
        program = args[0] if args else ""
        if program.startswith(f"{cache}/") and Path(program).name in CONTROLLERS and alive(pid):
            found[pid] = " ".join(args)
    return found
