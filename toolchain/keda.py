"""KEDA built with the scalers the test bed uses, not all 80 trigger types.

KEDA's scalers live in one Go package (``pkg/scalers``) and one switch
(``buildScaler`` in ``pkg/scaling/scalers_builder.go``), so a KEDA binary links every
scaler's client: Elasticsearch's typed API alone is 963 of the 3,710 packages the operator
and the metrics adapter import, and the cloud SDKs, Kafka, MongoDB and Temporal most of the
rest. The test bed's ScaledObjects use ``external-push`` (the frontend's queued audio,
``operator/transcription_operator/children/scaling.py``); this build keeps that one, its
sibling ``external``, and the few that need nothing more (``cpu``, ``memory``, ``cron``,
``kubernetes-workload``). Any other trigger type gets KEDA's own answer for an unknown one:
"no scaler found for type: ...". A cluster's own KEDA, installed from its release, is not
affected: this is the test bed's copy.

The build copies KEDA's module source, removes the other scalers' files from that copy,
keeps those cases of the switch, and builds against the copy (a ``replace`` in a copy of the
wrapper's go.mod): 1,951 packages instead of 3,710. KEDA's sources are never edited in the
module cache (Go refuses overlays there).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

MODULE = "github.com/kedacore/keda/v2"
TRIGGERS = ("cpu", "cron", "external", "external-push", "kubernetes-workload", "memory")
# The files of pkg/scalers kept: the Scaler interface and the scalers of TRIGGERS.
FILES = (
    "scaler.go",
    "cpu_memory_scaler.go",
    "cron_scaler.go",
    "external_scaler.go",
    "kubernetes_workload_scaler.go",
)
# A constant the external scaler uses, declared in a file that is left out
# (azure_queue_scaler.go); declared again here.
DECLARED = (
    "package scalers\n\n"
    "// Declared in azure_queue_scaler.go, which this build of KEDA leaves out.\n"
    'const externalMetricType = "External"\n'
)
BUILDER = "pkg/scaling/scalers_builder.go"
START, END = "// TRIGGERS-START", "// TRIGGERS-END"


def recipe() -> str:
    """What the trimmed build depends on, for the tool's cache entry."""
    what = "|".join((",".join(TRIGGERS), ",".join(FILES), DECLARED))
    return f"trim={hashlib.sha256(what.encode()).hexdigest()[:12]}"


def keep_cases(source: str, triggers: tuple[str, ...] = TRIGGERS) -> str:
    """`source` (scalers_builder.go) with only the switch cases of `triggers` between KEDA's
    TRIGGERS-START and TRIGGERS-END markers; the `default:` case (no scaler found) stays."""
    if source.count(START) != 1 or source.count(END) != 1:
        raise SystemExit(
            f"KEDA's {BUILDER} no longer has one {START} ... {END} block: update toolchain/keda.py "
            "for the pinned KEDA version"
        )
    begin, end = source.index(START) + len(START), source.index(END)
    # Each case, the default and each comment line starts a part at one tab's indent.
    parts = re.split(r"(?m)^(?=\t(?:case |default:|//))", source[begin:end])
    cases = {m.group(1): p for p in parts if (m := re.match(r'\tcase "([^"]+)":', p))}
    if missing := [t for t in triggers if t not in cases]:
        raise SystemExit(
            f"KEDA's {BUILDER} has no case for {', '.join(missing)}: update TRIGGERS in "
            "toolchain/keda.py for the pinned KEDA version"
        )
    wanted = {cases[t] for t in triggers}
    kept = [p for p in parts if p in wanted or not p.startswith(("\tcase ", "\t//"))]
    return source[:begin] + "".join(kept) + source[end:]


def trim(src: Path) -> None:
    """Trim a writable copy of KEDA's module source in place."""
    scalers = src / "pkg" / "scalers"
    if missing := [f for f in FILES if not (scalers / f).is_file()]:
        raise SystemExit(
            f"KEDA's pkg/scalers has no {', '.join(missing)}: update FILES in toolchain/keda.py "
            "for the pinned KEDA version"
        )
    for f in scalers.glob("*.go"):
        if f.name not in FILES:
            f.unlink()
    (scalers / "trimmed.go").write_text(DECLARED)
    builder = src / BUILDER
    builder.write_text(keep_cases(builder.read_text()))
