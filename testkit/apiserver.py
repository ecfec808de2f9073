"""The API server stand-in, for every test that needs one: objects kept by API path, with
what a real server adds and refuses.

- A write stores the object with a uid and a new resourceVersion (one counter for all, as
  etcd's revision is); server-side apply (PATCH) keeps the stored status; a merge-patch of
  ``.../status`` replaces the status of a stored object; POST creates in a collection
  (``generateName`` honoured) and refuses a name taken (409); PUT replaces an object whose
  resourceVersion it names (else 409); DELETE honours a uid precondition (409).
- A read finds what is stored (else 404); a list, what a collection holds (in one
  namespace or all; a cluster-scoped kind's), filtered by an equality label selector.
  Watches are not served: the tests feed the operator's watch cache themselves.

It answers in process (``request``, as ``transcription_operator.kube.Kube.request`` does,
raising its ``KubeError``) or over HTTP for a real client (``serve``). ``down`` makes every
request fail as against a server that is away.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import yaml

from transcription_operator.kinds import KINDS
from transcription_operator.kube import KubeError

PLURALS = {kind.plural for kind in KINDS.values()}
CLUSTER_PLURALS = {kind.plural for kind in KINDS.values() if kind.cluster_scoped}


def _drop_image_volumes(obj: dict[str, Any]) -> None:
    """A pod template's image volumes, and the mounts of them, left out."""
    pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    dropped = {v["name"] for v in pod.get("volumes") or [] if "image" in v}
    pod["volumes"] = [v for v in pod.get("volumes") or [] if v["name"] not in dropped]
    for c in pod.get("containers") or []:
        c["volumeMounts"] = [m for m in c.get("volumeMounts") or [] if m["name"] not in dropped]


def _error(status: int, reason: str, message: str) -> KubeError:
    body = {"kind": "Status", "status": "Failure", "code": status, "reason": reason,
            "message": message}  # fmt: skip
    return KubeError(status, reason, json.dumps(body))


class ApiServer:
    """The stand-in's state: its objects by path, the requests it got, whether it is down."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}  # API path -> object
        self.requests: list[tuple[str, str]] = []  # (method, path), in order
        self.down = False
        # False: a server without image volumes (Kubernetes 1.33-1.34 with the ImageVolume
        # feature gate off: it drops such volumes and their mounts from what it stores,
        # without an error, as kubernetes/pkg/api/pod's dropImageVolumes does).
        self.image_volumes = True
        self._revision = itertools.count(1)
        self._lock = threading.Lock()

    @staticmethod
    def path_of(obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        return KINDS[obj["kind"]].path(meta.get("namespace"), meta["name"])

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object as another writer would (a controller, a user); returns it as
        stored, with its new resourceVersion."""
        with self._lock:
            return self._store(self.path_of(obj), copy.deepcopy(obj))

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get(KINDS[kind].path(namespace, name))

    def remove(self, kind: str, namespace: str, name: str) -> None:
        self.objects.pop(KINDS[kind].path(namespace, name), None)

    def request(
        self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None,
        **_: Any,
    ) -> Any:  # fmt: skip
        """What `Kube.request` does against a real server (its other arguments, the
        content type and the time limit, change nothing here)."""
        path = path.split("?", 1)[0]
        self.requests.append((method, path))
        if self.down:
            raise ConnectionRefusedError("the API server is down")
        with self._lock:
            if method == "GET" and path not in self.objects and path.rsplit("/", 1)[1] in PLURALS:
                return copy.deepcopy(self._list(path, (query or {}).get("labelSelector", "")))
            return copy.deepcopy(self._answer(method, path, json.loads(json.dumps(body))))

    def _list(self, collection: str, selector: str) -> dict[str, Any]:
        """The objects directly in a collection; all namespaces' for a cluster-wide path."""
        base, _, plural = collection.rpartition("/")
        whole = "/namespaces/" in collection or plural in CLUSTER_PLURALS
        pattern = collection if whole else f"{base}/namespaces/[^/]+/{plural}"
        wanted = dict(pair.split("=", 1) for pair in selector.split(",") if pair)
        items = [
            obj for path, obj in self.objects.items()
            if re.fullmatch(f"{pattern}/[^/]+", path)
            and wanted.items() <= (obj["metadata"].get("labels") or {}).items()
        ]  # fmt: skip
        return {"kind": "List", "items": items}

    def _answer(self, method: str, path: str, body: Any) -> dict[str, Any]:
        stored = self.objects.get(path)
        if method == "GET":
            if stored is None:
                raise _error(404, "NotFound", f"{path} not found")
            return stored
        if method == "DELETE":
            if stored is None:
                raise _error(404, "NotFound", f"{path} not found")
            uid = ((body or {}).get("preconditions") or {}).get("uid")
            if uid and uid != stored["metadata"].get("uid"):
                raise _error(409, "Conflict", f"{path}: precondition failed: uid {uid}")
            del self.objects[path]
            return {"kind": "Status", "status": "Success"}
        body = body or {}
        if method == "PATCH" and path.endswith("/status"):  # a merge-patch of the status
            path = path.removesuffix("/status")
            if path not in self.objects:
                raise _error(404, "NotFound", f"{path} not found")
            return self._store(path, {**self.objects[path], "status": body.get("status", {})})
        if method == "PATCH":  # server-side apply: what is applied, the status kept
            obj = {**body, "status": (stored or {}).get("status")}
            if not self.image_volumes:
                _drop_image_volumes(obj)
            return self._store(path, {k: v for k, v in obj.items() if v is not None})
        if method == "POST":
            meta = body.setdefault("metadata", {})
            if not meta.get("name"):
                meta["name"] = f"{meta.get('generateName', '')}{next(self._revision):05x}"
            path = f"{path}/{meta['name']}"
            if path in self.objects:
                raise _error(409, "AlreadyExists", f"{path} already exists")
            return self._store(path, body)
        if method == "PUT":
            if stored is None:
                raise _error(404, "NotFound", f"{path} not found")
            version = body.get("metadata", {}).get("resourceVersion")
            if version != stored["metadata"].get("resourceVersion"):
                raise _error(409, "Conflict", f"{path} has been modified")
            return self._store(path, body)
        raise _error(405, "MethodNotAllowed", f"{method} {path}")

    def _store(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{obj.get('kind', 'Object')}-{meta.get('name', '')}")
        meta["resourceVersion"] = str(next(self._revision))
        if obj.get("kind") == "Service":  # a default the server adds: not drift
            obj.setdefault("spec", {}).setdefault("clusterIP", "10.0.0.1")
        self.objects[path] = obj
        return obj


class _Handler(BaseHTTPRequestHandler):
    server: _Http

    def _serve(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        body = yaml.safe_load(self.rfile.read(size)) if size else None  # JSON is YAML
        try:
            query = dict(parse_qsl(urlsplit(self.path).query))
            status, answer = 200, self.server.api.request(self.command, self.path, body, query)
        except KubeError as e:
            status, answer = e.status, json.loads(e.body)
        raw = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Http(ThreadingHTTPServer):
    daemon_threads = True
    api: ApiServer


@contextlib.contextmanager
def serve(api: ApiServer) -> Iterator[str]:
    """`api` over HTTP on 127.0.0.1 while the block runs; yields its URL."""
    http = _Http(("127.0.0.1", 0), _Handler)
    http.api = api
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{http.server_address[1]}"
    finally:
        http.shutdown()
        http.server_close()
