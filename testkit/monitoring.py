"""promtool over the chart's alert rules and the Grafana dashboard, on recorded series.

The series are the fixtures `testkit.metrics_record` writes (tests/fixtures/metrics/<source>/
<scenario>.prom: scrapes of the real components, with the monitors' target labels). promtool
is the pinned one (`toolchain`), built by `python -m testbed build`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import toolchain
from testkit.prom import FIXTURES, INTERVAL_S, Sample, read_fixture, series_text
from testkit.scrape import CHART

ALERTS = CHART / "files" / "alerts.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
STEPS = 50  # scrapes in a rule test: the recording, then its last state held (25 min)
EVAL = "20m"  # when the alerts are checked: past every rule's `for`
# Grafana's variables, as the check substitutes them: every namespace and deployment, and
# the rate interval Grafana picks for a 30 s scrape interval (4 x).
VARIABLES = {"$__rate_interval": "2m", "$__interval": "30s", "$__range": "1h",
             "$namespace": ".*", "$deployment": ".*", "$pool": ".*"}  # fmt: skip


def promtool() -> Path | None:
    """The pinned promtool, if it has been built."""
    path = toolchain.PROMTOOL.path("promtool")
    return path if path.exists() else None


def run_promtool(
    binary: Path, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary), *args], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "TZ": "UTC"})  # fmt: skip


def input_series(samples: Iterable[Sample], types: Mapping[str, str], steps: int,
                 extra: Mapping[str, str] | None = None) -> list[dict[str, str]]:  # fmt: skip
    """promtool's `input_series` for a recorded timeline, held for `steps` scrapes in all:
    the recorded scrapes, then the last scrape's state sustained (counters go on growing at
    their mean rate since the first scrape, gauges keep their last value). A counter absent
    from the first scrapes was 0 until it appeared; a gauge was absent. A series missing
    from the last scrape (gone, or its target down) stays absent."""
    samples = list(samples)
    end = max((s.step for s in samples), default=0)
    by_series: dict[str, dict[int, float]] = {}
    names: dict[str, str] = {}
    for s in samples:
        key = series_text(s.name, {**dict(s.labels), **(extra or {})})
        by_series.setdefault(key, {})[s.step] = s.value
        names[key] = s.name
    out = []
    for key in sorted(by_series):
        points = by_series[key]
        counter = types.get(names[key]) == "counter"
        values: list[str] = []
        for i in range(end + 1):
            v = points.get(i, 0.0 if counter and i < min(points) else None)
            values.append("_" if v is None else _num(v))
        if end in points and steps > end + 1:
            # A counter goes on at its mean rate since the first scrape (0 where absent).
            rate = (points[end] - points.get(0, 0.0)) / end if counter and end else 0.0
            values.append(f"{_num(points[end] + rate)}+{_num(rate)}x{steps - end - 2}")
        out.append({"series": key, "values": " ".join(values)})
    return out


def _num(v: float) -> str:
    return repr(int(v)) if v == int(v) else repr(v)


@dataclass
class Recording:
    """One source's scenarios (e.g. `local`, `testbed`): name -> samples, and the type of
    every sample name."""

    scenarios: dict[str, list[Sample]]
    types: dict[str, str]

    @classmethod
    def load(cls, source: str = "local", root: Path = FIXTURES) -> Recording:
        scenarios: dict[str, list[Sample]] = {}
        types: dict[str, str] = {}
        for path in sorted((root / source).glob("*.prom")):
            samples, t = read_fixture(path)
            scenarios[path.stem] = samples
            types |= t
        if not scenarios:
            raise FileNotFoundError(
                f"no recorded series in {root / source}: run python -m testkit.metrics_record"
            )
        return cls(scenarios, types)

    def names(self) -> set[str]:
        """Every metric name recorded (a histogram's as `x_bucket`, `x_sum`, `x_count`)."""
        return {s.name for samples in self.scenarios.values() for s in samples}

    def series(self, scenario: str | None = None) -> list[dict[str, str]]:
        """promtool input_series: one scenario, or all of them (each series labelled with
        its `scenario`, so that they do not collide)."""
        if scenario is not None:
            return input_series(self.scenarios[scenario], self.types, STEPS)
        out: list[dict[str, str]] = []
        for name, samples in self.scenarios.items():
            out += input_series(samples, self.types, STEPS, extra={"scenario": name})
        return out


# --------------------------------------------------------------------------- alert rules


def rules_without_annotations(rules: Mapping[str, Any]) -> dict[str, Any]:
    """The rule file with the alerts' annotations left out: promtool's rule tests compare
    annotations too, and their text is not what the tests are about (`check rules` still
    parses their templates, on the file as shipped)."""
    out = json.loads(json.dumps(rules))
    for group in out["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return dict(out)


def alert_tests(
    recording: Recording,
    expected: Mapping[str, Mapping[str, Sequence[Mapping[str, str]]]],
    alerts: Iterable[str],
) -> dict[str, Any]:
    """A promtool rule-test file: for each scenario, every alert at EVAL either fires with
    exactly the expected labels (`expected[scenario][alert]`) or stays silent."""
    tests = []
    for scenario in recording.scenarios:
        want = expected.get(scenario, {})
        tests.append({
            "name": scenario,
            "interval": f"{INTERVAL_S}s",
            "input_series": recording.series(scenario),
            "alert_rule_test": [
                {"eval_time": EVAL, "alertname": a,
                 "exp_alerts": [{"exp_labels": dict(labels)} for labels in want.get(a, [])]}
                for a in alerts
            ],
        })  # fmt: skip
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "30s", "tests": tests}


def test_rules(
    binary: Path, rules: Mapping[str, Any], tests: Mapping[str, Any]
) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "rules.yaml").write_text(yaml.safe_dump(dict(rules), sort_keys=False))
        (Path(d) / "tests.yaml").write_text(
            yaml.safe_dump(dict(tests), sort_keys=False, width=10_000)
        )
        return run_promtool(binary, "test", "rules", "tests.yaml", cwd=Path(d))


# --------------------------------------------------------------------------- the dashboard


@dataclass(frozen=True)
class Query:
    panel: str
    ref: str  # the target's refId
    expr: str

    @property
    def evaluable(self) -> str:
        """The query with Grafana's variables substituted."""
        out = self.expr
        for var in sorted(VARIABLES, key=len, reverse=True):
            out = out.replace("${" + var[1:] + "}", VARIABLES[var]).replace(var, VARIABLES[var])
        if "$" in out:
            raise ValueError(
                f"panel {self.panel!r} ({self.ref}): unknown variable in {self.expr!r}"
            )
        return out


def queries(dashboard: Mapping[str, Any]) -> list[Query]:
    """Every PromQL query of every panel (rows' nested panels included)."""
    out = []
    panels = list(dashboard.get("panels", []))
    while panels:
        p = panels.pop(0)
        panels += p.get("panels", [])
        for t in p.get("targets", []):
            if t.get("expr"):
                out.append(Query(p.get("title", "?"), t.get("refId", "?"), t["expr"]))
    return out


PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "offset", "bool", "inf", "nan", "atan2", "start", "end",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside label matchers,
    grouping clauses, strings and ranges that are neither functions nor keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in PROMQL_WORDS or re.fullmatch(r"\d+[smhdwy]", word):
            continue
        names.add(word)
    return names


def check_dashboard(
    dashboard: Mapping[str, Any], recording: Recording, binary: Path | None
) -> list[str]:
    """What is wrong with the dashboard's queries, one clear line each (none: every query
    names only recorded metrics and returns data on the recorded series). Without promtool
    only the names are checked."""
    problems = []
    known = recording.names()
    qs = queries(dashboard)
    for q in qs:
        unknown = sorted(metric_names(q.expr) - known)
        if unknown:
            problems.append(f"panel {q.panel!r} ({q.ref}) queries {', '.join(unknown)}, which no "
                            f"component exports (none in the recorded series): {q.expr}")  # fmt: skip
    if problems or binary is None:
        return problems
    alerts = {f"Q{i}": q for i, q in enumerate(qs)}
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"alert": name, "expr": f"count({q.evaluable}) > 0"} for name, q in alerts.items()]}]}  # fmt: skip
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "30s", "tests": [{
        "interval": f"{INTERVAL_S}s", "input_series": recording.series(),
        "alert_rule_test": [{"eval_time": "10m", "alertname": name, "exp_alerts": [{"exp_labels": {}}]}
                            for name in alerts],
    }]}  # fmt: skip
    out = test_rules(binary, rules, tests)
    if out.returncode == 0:
        return []
    failed = sorted(
        set(re.findall(r"alertname: (Q\d+)", out.stdout + out.stderr)), key=lambda a: int(a[1:])
    )
    if not failed:
        return [f"promtool failed on the dashboard's queries:\n{out.stdout}{out.stderr}"]
    return [f"panel {alerts[a].panel!r} ({alerts[a].ref}) returns no data on the recorded series: "
            f"{alerts[a].expr}" for a in failed]  # fmt: skip


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
