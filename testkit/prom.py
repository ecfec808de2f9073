"""The Prometheus text format, as the monitoring tests keep it: a scrape parsed into
samples, and the fixtures (tests/fixtures/metrics/<source>/<scenario>.prom), each a
scenario's timeline of scrapes in the text format with a timestamp on every sample: scrape
*i* at *i* x 30 s (the chart's monitors' interval).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "metrics"
INTERVAL_S = 30  # between scrapes in a fixture: the monitors' default interval


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]  # sorted
    value: float
    step: int = 0  # the scrape's index in its scenario

    @property
    def series(self) -> str:
        return series_text(self.name, dict(self.labels))


def series_text(name: str, labels: Mapping[str, str]) -> str:
    """`name{a="x",b="y"}`, labels sorted, values escaped as the text format escapes them."""
    if not labels:
        return name
    esc = {
        k: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        for k, v in labels.items()
    }
    return name + "{" + ",".join(f'{k}="{esc[k]}"' for k in sorted(esc)) + "}"


CUMULATIVE = {"counter", "histogram", "summary"}  # their samples only grow


def parse(text: str) -> tuple[list[Sample], dict[str, str]]:
    """The samples of an exposition (a scrape, or a fixture with timestamps) and the type of
    each sample name: counter samples (and a histogram's _bucket, _count and _sum) are
    cumulative, the rest gauges."""
    samples: list[Sample] = []
    types: dict[str, str] = {}
    families = list(text_string_to_metric_families(text))
    cumulative = {f.name for f in families if f.type in CUMULATIVE}
    for family in families:
        if family.name.endswith("_created") and family.name[: -len("_created")] in cumulative:
            continue  # a counter's creation time (its own gauge in the text format)
        for s in family.samples:
            if s.name.endswith("_created") and family.type in CUMULATIVE:
                continue
            types[s.name] = "counter" if family.type in CUMULATIVE else "gauge"
            step = round(float(s.timestamp) / INTERVAL_S) if s.timestamp is not None else 0
            labels = tuple(sorted(s.labels.items()))
            samples.append(Sample(s.name, labels, float(s.value), step))
    return samples, types


def write_fixture(
    path: Path, header: str, timeline: list[list[Sample]], types: Mapping[str, str]
) -> None:
    """A scenario's scrapes as the text format, each sample stamped with its scrape's time."""
    by_family: dict[str, list[Sample]] = {}
    for step, samples in enumerate(timeline):
        for s in samples:
            by_family.setdefault(family_of(s.name, types), []).append(
                Sample(s.name, s.labels, s.value, step)
            )
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for fam in sorted(by_family):
        kind = "counter" if types.get(fam + "_total", types.get(fam)) == "counter" else "gauge"
        lines.append(f"# TYPE {fam} {kind}")
        for s in sorted(by_family[fam], key=lambda s: (s.series, s.step)):
            lines.append(f"{s.series} {s.value:.17g} {s.step * INTERVAL_S * 1000}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def family_of(name: str, types: Mapping[str, str]) -> str:
    """Counters are one family per sample name (`x_total` as `x`); a histogram's samples
    are written as counters of their own (`x_bucket`, `x_count`, `x_sum`): the fixture keeps
    only what Prometheus keeps, series and whether they are cumulative."""
    if types.get(name) == "counter" and name.endswith("_total"):
        return name[: -len("_total")]
    return name


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+) (\d+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def read_fixture(path: Path) -> tuple[list[Sample], dict[str, str]]:
    """A fixture's samples (their step from their timestamp) and the type of each sample
    name (a counter family `x` types its sample `x_total`)."""
    samples: list[Sample] = []
    family_types: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            family_types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise ValueError(f"{path}: not a sample: {line}")
        name, labels, value, ts = m.groups()
        pairs = tuple(
            sorted(
                (k, bytes(v, "utf-8").decode("unicode_escape"))
                for k, v in _LABEL.findall(labels or "")
            )
        )
        samples.append(Sample(name, pairs, float(value), round(int(ts) / 1000 / INTERVAL_S)))
    types = {
        s.name: "counter"
        if "counter" in (family_types.get(s.name), family_types.get(s.name.removesuffix("_total")))
        else "gauge"
        for s in samples
    }
    return samples, types
