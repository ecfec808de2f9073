"""`kubectl get ... -o json`, answered in this process: the suites' reads of the cluster
without a kubectl process for each.

The e2e suite reads the cluster about 1,800 times a run, most of them while it polls. A
kubectl process costs about 38 ms of CPU (the Go runtime's start, the registration of its API
types, the kubeconfig and discovery cache read); an answer over a kept-open HTTPS connection
costs a few. Only the plain form is served here,

    get KIND[/NAME] [NAME] [-n NS] [-l SELECTOR] [--ignore-not-found] [--request-timeout=Ns] -o json

with kubectl's output: the object itself for a name, else kubectl's `List`, whose items
carry their `apiVersion` and `kind`. Kinds are found as kubectl finds them (plural, singular,
short name or kind, with or without `.group`; the core group first) in the API server's
discovery. Anything else (another output, several kinds, a kind discovery does not name), and
any answer but 200 or an object's 404, is left to kubectl itself, whose messages the suites
read: a stopped API server is answered by kubectl's own refusal, a paused one times out as
kubectl would.

Only the standard library is used (like kubectl.py).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import ssl
import subprocess
import tempfile
import threading
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SECONDS = re.compile(r"--request-timeout=(\d+(?:\.\d+)?)s")
VALUED = {"-n": "n", "--namespace": "n", "-l": "l", "--selector": "l", "-o": "o", "--output": "o"}
CORE = "/api/v1"
# The credentials read here (`--flatten` inlines files); any other (exec, auth-provider...)
# leaves every read to kubectl.
USER_KEYS = frozenset({"client-certificate-data", "client-key-data", "token"})


@dataclass(frozen=True)
class Get:
    """One read, as its command line asked for it."""

    kind: str  # as typed: "pods", "tdeploy", "deployments.apps"
    name: str | None
    namespace: str | None
    selector: str | None = None
    ignore_not_found: bool = False
    request_timeout: float | None = None


def parse(args: Sequence[str]) -> Get | None:
    """The read `args` (kubectl's, after `--kubeconfig`) ask for, when this module serves
    it; None for kubectl itself."""
    if not args or args[0] != "get":
        return None
    words: list[str] = []
    options: dict[str, str] = {}
    ignore, request_timeout = False, None
    rest = iter(args[1:])
    for arg in rest:
        if arg in VALUED:
            value = next(rest, None)
            if value is None:
                return None
            options[VALUED[arg]] = value
        elif arg == "--ignore-not-found":
            ignore = True
        elif m := SECONDS.fullmatch(arg):
            request_timeout = float(m.group(1))
        elif arg.startswith("-"):
            return None  # -A, -w, --sort-by, --field-selector...: kubectl's own
        else:
            words.append(arg)
    if options.get("o") != "json" or not 1 <= len(words) <= 2 or "," in words[0]:
        return None
    kind, _, slashed = words[0].partition("/")
    name = words[1] if len(words) == 2 else slashed or None
    if "/" in words[0] and (not slashed or "/" in slashed or len(words) == 2):
        return None
    if name and "l" in options:
        return None  # kubectl refuses a name with a selector: its message
    return Get(kind, name, options.get("n"), options.get("l"), ignore, request_timeout)


@dataclass(frozen=True)
class Resource:
    """A kind of the API server, as discovery lists it."""

    group_path: str  # "/api/v1", "/apis/apps/v1"
    plural: str
    namespaced: bool

    def path(self, namespace: str | None, name: str | None) -> str:
        scope = f"/namespaces/{namespace}" if self.namespaced else ""
        return f"{self.group_path}{scope}/{self.plural}" + (f"/{name}" if name else "")


def names(group_path: str, resource: dict[str, Any]) -> list[str]:
    """Every name kubectl knows a resource by (its APIResource in discovery)."""
    group = group_path.split("/")[2] if group_path.startswith("/apis/") else ""
    plain = [resource["name"], resource.get("singularName") or "", resource["kind"].lower()]
    plain = [n for n in plain if n]
    qualified = [f"{n}.{group}" for n in plain] if group else []
    return [*plain, *resource.get("shortNames", []), *qualified]


def index(lists: dict[str, dict[str, Any]]) -> dict[str, list[Resource]]:
    """Name -> the resources it may mean, from each group version's APIResourceList."""
    found: dict[str, list[Resource]] = {}
    for group_path, listing in lists.items():
        for r in listing.get("resources", []):
            if "/" in r["name"] or "get" not in r.get("verbs", []):
                continue  # a subresource, or not readable
            res = Resource(group_path, r["name"], bool(r.get("namespaced")))
            for n in dict.fromkeys(names(group_path, r)):
                found.setdefault(n.lower(), []).append(res)
    return found


def choose(candidates: list[Resource]) -> Resource | None:
    """kubectl's choice among the resources a name may mean: the only one, or the core
    group's; None where it would have to weigh groups (kubectl then decides)."""
    if len(candidates) == 1:
        return candidates[0]
    core = [c for c in candidates if c.group_path == CORE]
    return core[0] if len(core) == 1 else None


def output(get: Get, status: int, body: dict[str, Any]) -> subprocess.CompletedProcess[str] | None:
    """kubectl's answer to `get` for the API server's; None where kubectl must answer."""
    argv = ["kubectl", "get", get.kind]
    if status == 404 and get.name and body.get("details", {}).get("name") == get.name:
        if get.ignore_not_found:
            return subprocess.CompletedProcess(argv, 0, "", "")
        message = f"Error from server (NotFound): {body.get('message', '')}\n"
        return subprocess.CompletedProcess(argv, 1, "", message)
    if status != 200:
        return None
    if get.name:
        body.get("metadata", {}).pop("managedFields", None)  # kubectl leaves them out
        return subprocess.CompletedProcess(argv, 0, json.dumps(body, indent=4) + "\n", "")
    items = body.get("items") or []
    if not items and get.ignore_not_found:
        return subprocess.CompletedProcess(argv, 0, "", "")
    kind = str(body.get("kind", "")).removesuffix("List")
    for item in items:
        item.setdefault("apiVersion", body.get("apiVersion"))
        item.setdefault("kind", kind)
        item.get("metadata", {}).pop("managedFields", None)
    wrapped = {
        "apiVersion": "v1",
        "items": items,
        "kind": "List",
        "metadata": {"resourceVersion": ""},
    }
    return subprocess.CompletedProcess(argv, 0, json.dumps(wrapped, indent=4) + "\n", "")


class Unanswered(Exception):
    """The API server gave no answer this module can stand for: kubectl asks again."""


class Reader:
    """Reads over one kept-open HTTPS connection a thread, with the kubeconfig's
    credentials (read once with `kubectl config view`, again when the file changes)."""

    def __init__(self, kubectl: str, kubeconfig: Path) -> None:
        self.kubectl, self.kubeconfig = kubectl, kubeconfig
        self._lock = threading.Lock()
        self._local = threading.local()
        self._loaded: float | None = None  # the kubeconfig's mtime when read
        self._unread: float | None = None  # its mtime when it could not be read
        self._server: urllib.parse.SplitResult | None = None
        self._context: ssl.SSLContext | None = None
        self._headers: dict[str, str] = {}
        self._namespace = "default"
        self._index: dict[str, list[Resource]] | None = None
        self._epoch = 0  # a new kubeconfig: every thread's connection is dropped

    def answer(self, get: Get, timeout: float | None) -> subprocess.CompletedProcess[str] | None:
        """kubectl's answer, or None where kubectl itself must answer. A read that outlasts
        `timeout` raises subprocess.TimeoutExpired, as kubectl's process would, unless the
        command gave its own --request-timeout (kubectl then fails with a message)."""
        bound = get.request_timeout or timeout
        try:
            self._configure()
            resource = self._resource(get.kind, bound)
            if resource is None:
                return None
            path = resource.path(get.namespace or self._namespace, get.name)
            if get.selector:
                path += "?" + urllib.parse.urlencode({"labelSelector": get.selector})
            status, body = self._request(path, bound)
        except TimeoutError:
            self._drop()
            if get.request_timeout:
                message = "Unable to connect to the server: context deadline exceeded\n"
                return subprocess.CompletedProcess(["kubectl", "get"], 1, "", message)
            raise subprocess.TimeoutExpired(["kubectl", "get", get.kind], bound or 0) from None
        except (Unanswered, OSError, http.client.HTTPException, ValueError, KeyError):
            self._drop()
            return None
        if status == 404 and not body.get("details", {}).get("name"):
            self._index = None  # a kind gone since discovery: look again next time
        return output(get, status, body)

    # ------------------------------------------------------------------ credentials

    def _configure(self) -> None:
        mtime = self.kubeconfig.stat().st_mtime
        if self._loaded == mtime:
            return
        with self._lock:
            if self._loaded == mtime:
                return
            if self._unread == mtime:
                raise Unanswered("a kubeconfig this module does not read")
            try:
                self._read(self.view())
            except Exception:
                self._unread = mtime  # not asked again until the file changes
                raise
            self._loaded, self._unread = mtime, None

    def _read(self, config: dict[str, Any]) -> None:
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0].get("user", {})
        context = config["contexts"][0].get("context", {})
        server = urllib.parse.urlsplit(cluster["server"])
        if server.scheme != "https" or set(user) - USER_KEYS:
            raise Unanswered("a kubeconfig this module does not read")
        self._server, self._context = server, _tls(cluster, user)
        self._headers = {"Accept": "application/json"}
        if token := user.get("token"):
            self._headers["Authorization"] = f"Bearer {token}"
        self._namespace = context.get("namespace") or "default"
        self._index = None
        self._epoch += 1

    def view(self) -> dict[str, Any]:
        """The kubeconfig's cluster, user and context, their files inlined."""
        view = subprocess.run(
            [self.kubectl, "--kubeconfig", str(self.kubeconfig), "config", "view",
             "--raw", "--minify", "--flatten", "-o", "json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if view.returncode:
            raise Unanswered(view.stderr)
        config: dict[str, Any] = json.loads(view.stdout)
        return config

    # ------------------------------------------------------------------ discovery

    def _resource(self, kind: str, timeout: float | None) -> Resource | None:
        fresh = self._index is None
        if self._index is None:
            self._index = self._discover(timeout)
        if not (candidates := self._index.get(kind.lower())) and not fresh:
            self._index = self._discover(timeout)  # a kind added since (a CRD)
            candidates = self._index.get(kind.lower())
        return choose(candidates) if candidates else None  # None: kubectl's message

    def _discover(self, timeout: float | None) -> dict[str, list[Resource]]:
        lists = {CORE: self._ok(CORE, timeout)}
        for group in self._ok("/apis", timeout).get("groups", []):
            version = group.get("preferredVersion", {}).get("groupVersion")
            if version:
                lists[f"/apis/{version}"] = self._ok(f"/apis/{version}", timeout)
        return index(lists)

    def _ok(self, path: str, timeout: float | None) -> dict[str, Any]:
        status, body = self._request(path, timeout)
        if status != 200:
            raise Unanswered(f"{path}: {status}")
        return body

    # ------------------------------------------------------------------ HTTP

    def _request(self, path: str, timeout: float | None) -> tuple[int, dict[str, Any]]:
        """One GET; a kept-open connection the server has closed is opened again once."""
        for attempt in (0, 1):
            conn, reused = self._connection(timeout)
            try:
                conn.request("GET", path, headers=self._headers)
                response = conn.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._drop()
                if reused and not attempt:
                    continue
                raise
            try:
                return response.status, json.loads(data or b"{}")
            except ValueError:
                raise Unanswered(f"{path}: {response.status}, not JSON") from None
        raise Unanswered(path)  # not reached: the second attempt returns or raises

    def _connection(self, timeout: float | None) -> tuple[http.client.HTTPSConnection, bool]:
        local = self._local
        conn: http.client.HTTPSConnection | None = getattr(local, "conn", None)
        if conn is not None and getattr(local, "epoch", None) == self._epoch:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            return conn, True
        assert self._server is not None and self._server.hostname
        conn = http.client.HTTPSConnection(
            self._server.hostname, self._server.port or 443, timeout=timeout,
            context=self._context,
        )  # fmt: skip
        local.conn, local.epoch = conn, self._epoch
        return conn, False

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def _tls(cluster: dict[str, Any], user: dict[str, Any]) -> ssl.SSLContext:
    """The TLS context of the kubeconfig's cluster and user (its data inlined by
    `--flatten`); the client's key touches the disk only while it is loaded."""
    context = ssl.create_default_context()
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    elif ca := cluster.get("certificate-authority-data"):
        context.load_verify_locations(cadata=base64.b64decode(ca).decode())
    if "client-certificate-data" in user:
        with tempfile.TemporaryDirectory(prefix="kubeget-") as tmp:
            cert, key = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(base64.b64decode(user["client-key-data"]))
            context.load_cert_chain(cert, key)
    return context
