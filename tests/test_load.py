"""The load generator (testbed/load.py): its failure message says what the requests got (a
scenario that times out waiting for successes names the statuses, not just a count), and a
client with a duty under 1 waits between requests, against a real HTTP server."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator

import pytest

from testbed.load import Load, Outcome, pause, summarize


def test_the_summary_counts_each_status_and_shows_the_first_errors() -> None:
    outcomes = [Outcome(0, 1, 200), Outcome(1, 2, 503, "overloaded"), Outcome(2, 3, 503, "busy"),
                Outcome(3, 4, 0, "ConnectError: refused"), Outcome(4, 5, 200, "empty transcript")]  # fmt: skip
    text = summarize(outcomes, examples=2)
    assert text.startswith("5 answered (1 x 0, 2 x 200, 2 x 503)"), text
    assert "first errors: ['503: overloaded', '503: busy']" in text, text


def test_no_requests_at_all_is_said_so() -> None:
    assert summarize([]) == "0 answered (none)"


# ------------------------------------------------------------------- pacing (Load.duty)


class _SlowTranscriber(http.server.BaseHTTPRequestHandler):
    """Answers every transcription after DELAY seconds, with a transcript."""

    DELAY = 0.3

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(self.DELAY)
        body = json.dumps({"text": "hello"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def transcriber() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowTranscriber)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_client_waits_what_its_duty_leaves() -> None:
    assert pause(2.0, 1.0) == 0.0  # back to back
    assert pause(2.0, 0.5) == 2.0  # as long as the request took
    assert pause(1.0, 0.25) == 3.0


@pytest.mark.parametrize("duty", [0.0, -0.5, 1.5])
def test_a_duty_outside_0_to_1_is_refused_before_any_client_starts(
    duty: float, transcriber: str
) -> None:
    with pytest.raises(ValueError, match=r"more than 0 and at most 1, not "):
        Load(transcriber, b"RIFF", 1, duty=duty)
    with Load(transcriber, b"RIFF", 1) as load:  # and a good one still runs
        load.wait_for_successes(1, timeout=30)


def test_a_paced_client_waits_as_long_as_its_last_request_took(transcriber: str) -> None:
    with Load(transcriber, b"RIFF", 1, duty=0.5) as load:
        load.wait_for_successes(3, timeout=30)
    first, second, third = load.outcomes[:3]
    assert all(o.ok for o in (first, second, third)), load.outcomes
    assert second.start - first.end >= first.seconds * 0.99
    assert third.start - second.end >= second.seconds * 0.99


def test_stop_ends_a_clients_wait_at_once(transcriber: str) -> None:
    load = Load(transcriber, b"RIFF", 1, duty=0.01)  # waits 99 times 0.3 s after each answer
    with load:
        load.wait_for_successes(1, timeout=30)
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 10
    assert len(load.outcomes) == 1
