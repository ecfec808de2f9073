"""Kubernetes' units as the resource writes them: each parser reads every value its CRD
pattern admits."""

from __future__ import annotations

import re

import pytest

from transcription_api.units import DURATION, QUANTITY, cpu_threads, duration_seconds, quantity


@pytest.mark.parametrize(
    ("cpu", "threads"),
    [(None, 0), ("", 0), ("500m", 1), ("1", 1), ("1.5", 2), ("2000m", 2), ("16", 16), ("1k", 256)],
)
def test_cpu_quantity_to_threads(cpu: str | None, threads: int) -> None:
    assert cpu_threads(cpu) == threads


@pytest.mark.parametrize(
    ("text", "value"),
    [("250m", 0.25), ("2", 2.0), ("0.5", 0.5), ("1k", 1000.0), ("3M", 3e6), ("1G", 1e9),
     ("1T", 1e12), ("4Ki", 4096.0), ("8Mi", 8.0 * 2**20), ("2Gi", 2.0 * 2**30),
     ("1Ti", 2.0**40), ("1.5Gi", 1.5 * 2**30)],
)  # fmt: skip
def test_quantities(text: str, value: float) -> None:
    assert re.match(QUANTITY, text)  # the CRD admits it
    assert quantity(text) == value


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("5m", 300), ("1h30m", 5400), ("2h", 7200), ("1m1s", 61)]
)
def test_durations(text: str, seconds: int) -> None:
    assert re.match(DURATION, text)
    assert duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["-1", "2e3", "1Pi", "m", "", "1 Gi"])
def test_quantities_the_crd_refuses(text: str) -> None:
    assert not re.match(QUANTITY, text)


@pytest.mark.parametrize("text", ["90", "1d", "5 m", "m5", ""])
def test_durations_the_crd_refuses(text: str) -> None:
    assert not re.match(DURATION, text)
