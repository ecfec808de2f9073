"""The operator's REST layer over real HTTP: a request to an API server that stops
answering mid-request fails within the request timeout (the reconcile then retries), instead
of holding its worker and its key for good."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import urllib3
from kubernetes import client

from transcription_operator import kube
from transcription_operator.kube import Kube


@pytest.fixture
def silent_server() -> Iterator[str]:
    """An 'API server' that accepts connections, reads the request and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(conn)  # held open, never written to

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        listener.close()


@pytest.mark.parametrize(
    ("default", "explicit"),
    [((1.0, 0.5), None), ((1.0, 60.0), (1.0, 0.3))],
    ids=["the default timeout", "an explicit timeout wins over the default"],
)
def test_a_request_the_api_server_never_answers_fails_after_its_timeout(
    silent_server: str,
    monkeypatch: pytest.MonkeyPatch,
    default: tuple[float, float],
    explicit: tuple[float, float] | None,
) -> None:
    monkeypatch.setattr(kube, "REQUEST_TIMEOUT", default)
    k = Kube(client.ApiClient(client.Configuration(host=silent_server)))
    # urllib3 says which read timeout ran out: the explicit one, else the default's, never
    # an endless wait (which this test would sit in until pytest's timeout failed it).
    read = (explicit or default)[1]
    with pytest.raises(urllib3.exceptions.MaxRetryError, match=rf"read timeout={read}\)"):
        k.request("GET", "/api/v1/namespaces/ns/services/svc", timeout=explicit)
