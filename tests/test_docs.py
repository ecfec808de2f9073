"""The documentation site's home page repeats the README's opening (what the project is,
why, how it works) word for word, with links that point inside `docs/`: the two never
drift apart. The metrics page names every metric the frontend and the worker export."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from transcription_frontend import metrics as frontend_metrics
from transcription_worker import metrics as worker_metrics

ROOT = Path(__file__).resolve().parents[1]
SHARED_UNTIL = "## Quick start"  # the README's sections before it appear on the home page


def readme_opening() -> str:
    text = (ROOT / "README.md").read_text()
    opening = text[: text.index(SHARED_UNTIL)]
    return re.sub(r"\]\(docs/", "](", opening).rstrip()


def test_the_home_page_opens_with_the_readme_opening() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    opening = readme_opening()
    assert index.startswith(opening + "\n"), (
        "docs/index.md must start with README.md's sections before "
        f"{SHARED_UNTIL!r} (links without the docs/ prefix): copy them over"
    )


def test_the_readme_opening_links_only_into_docs_or_the_web() -> None:
    """A link of the shared part must work from both pages: into docs/, or absolute."""
    links = re.findall(r"\]\(([^)]+)\)", (ROOT / "README.md").read_text().split(SHARED_UNTIL)[0])
    assert links
    assert all(link.startswith(("docs/", "http://", "https://", "#")) for link in links), links


def test_one_security_page() -> None:
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")
                   if "security" in p.name)  # fmt: skip
    assert pages == ["security.md"], pages


def test_every_metric_the_frontend_and_the_worker_export_is_documented() -> None:
    documented = set(
        re.findall(r"`([a-z0-9_:]+)`", (ROOT / "docs/operations/metrics.md").read_text())
    )
    exported = {
        m._name + ("_total" if m._type == "counter" else "")
        for module in (frontend_metrics, worker_metrics)
        for m in vars(module).values()
        if isinstance(m, MetricWrapperBase)
    }
    assert len(exported) > 20
    assert exported - documented == set(), "add them to docs/operations/metrics.md"
