"""The chart's README: its values table is generated and current; its icon exists."""

from __future__ import annotations

from pathlib import Path

import yaml

from charts import render_readme

ROOT = Path(__file__).resolve().parents[1]


def test_chart_readme_values_table_is_current() -> None:
    text = render_readme.README.read_text()
    assert render_readme.update(text) == text, (
        "charts/transcription-operator/README.md is stale: run `make chart-readme`"
    )


def test_every_value_has_a_row() -> None:
    """Each key values.yaml sets (down to a key written with its value) is in the table."""
    values = yaml.safe_load(render_readme.VALUES.read_text())
    table = render_readme.render()
    written = render_readme.keys(render_readme.VALUES.read_text())
    assert {k.path[0] for k in written} == set(values)
    for key in written:
        if not key.block:
            assert f"| `{'.'.join(key.path)}` |" in table


def test_comments_become_descriptions() -> None:
    keys = {k.path: k for k in render_readme.keys(render_readme.VALUES.read_text())}
    assert keys[("replicas",)].doc.startswith("Operator replicas. With leader election")
    assert keys[("image", "tag")].trailing == "default: the chart's appVersion"
    assert keys[("image", "repository")].doc == ""


def test_chart_icon_is_a_file_of_this_repository() -> None:
    """Helm wants a URL: a raw one into this repository, whose file must exist."""
    chart = yaml.safe_load((render_readme.CHART / "Chart.yaml").read_text())
    home = chart["home"].removeprefix("https://github.com/")
    prefix = f"https://raw.githubusercontent.com/{home}/main/"
    assert chart["icon"].startswith(prefix), chart["icon"]
    icon = ROOT / chart["icon"].removeprefix(prefix)
    assert icon.is_file(), f"{icon} does not exist"
    assert icon.read_text().lstrip().startswith("<svg")
