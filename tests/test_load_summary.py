"""The load generator's failure message says what the requests got (testbed/load.py): a
scenario that times out waiting for successes names the statuses, not just a count."""

from __future__ import annotations

from testbed.load import Outcome, summarize


def test_the_summary_counts_each_status_and_shows_the_first_errors() -> None:
    outcomes = [Outcome(0, 1, 200), Outcome(1, 2, 503, "overloaded"), Outcome(2, 3, 503, "busy"),
                Outcome(3, 4, 0, "ConnectError: refused"), Outcome(4, 5, 200, "empty transcript")]  # fmt: skip
    text = summarize(outcomes, examples=2)
    assert text.startswith("5 answered (1 x 0, 2 x 200, 2 x 503)"), text
    assert "first errors: ['503: overloaded', '503: busy']" in text, text


def test_no_requests_at_all_is_said_so() -> None:
    assert summarize([]) == "0 answered (none)"
