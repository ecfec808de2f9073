"""Kubernetes' units as the resource writes them: quantities ("500m", "2Gi") and durations
("90s", "1h30m"), each with the pattern the CRD checks and the parser that reads it."""

from __future__ import annotations

import math
import re

# A quantity the CRD accepts (a subset of Kubernetes': no exponents, no signs).
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$"
QUANTITY_SUFFIXES = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                     "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}  # fmt: skip
DURATION = r"^([0-9]+(s|m|h))+$"
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}
MAX_THREADS = 256


def quantity(text: str) -> float:
    """A Kubernetes quantity's value ("500m" -> 0.5, "2Gi" -> 2147483648)."""
    number = text.rstrip("kKMGTim")
    return float(number) * QUANTITY_SUFFIXES.get(text[len(number) :], 1)


def cpu_threads(cpu: str | None) -> int:
    """A CPU quantity rounded up to whole threads ("500m" -> 1, "2" -> 2), at most
    `MAX_THREADS`; 0 when unset."""
    if not cpu:
        return 0
    return min(MAX_THREADS, max(1, math.ceil(quantity(cpu))))


def duration_seconds(value: str) -> int:
    """Seconds of a duration such as '90s', '5m' or '1h30m'."""
    return sum(int(n) * DURATION_UNITS[u] for n, u in re.findall(r"([0-9]+)([smh])", value))
