"""The operator's REST layer over real HTTP: a request to an API server that stops
answering mid-request fails within the request timeout (the reconcile then retries), instead
of holding its worker and its key for good."""

from __future__ import annotations

import socket
import threading
import time
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


def test_a_request_the_api_server_never_answers_fails_after_the_timeout(
    silent_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube, "REQUEST_TIMEOUT", (1.0, 0.5))
    k = Kube(client.ApiClient(client.Configuration(host=silent_server)))
    start = time.monotonic()
    with pytest.raises(urllib3.exceptions.MaxRetryError, match="Read timed out"):
        k.get("Service", "ns", "svc")
    # urllib3 retries a GET three times: four reads of 0.5 s, never an endless wait.
    assert time.monotonic() - start < 10


def test_an_explicit_timeout_wins_over_the_default(
    silent_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube, "REQUEST_TIMEOUT", (1.0, 60.0))
    k = Kube(client.ApiClient(client.Configuration(host=silent_server)))
    start = time.monotonic()
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        k.request("GET", "/api/v1/namespaces/ns/services/svc", timeout=0.3)
    assert time.monotonic() - start < 10
