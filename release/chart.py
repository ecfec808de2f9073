"""Package the chart and push it to an OCI registry, with the pinned helm (``toolchain``).

    python -m release.chart package DEST       lint, then helm package into DEST; prints the
                                               archive's path
    python -m release.chart push ARCHIVE oci://ghcr.io/OWNER/charts
                                               helm push; prints the pushed reference by digest
                                               (what cosign signs)
    python -m release.chart helm               the helm binary's path (for `helm registry login`)

The chart must carry the release's version (``python -m release.version set`` stamps it):
packaging a chart whose ``version`` or ``appVersion`` disagrees with ``pyproject.toml`` fails.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import toolchain
from release import cli
from release.version import ROOT, VersionError, current, parse

CHART = ROOT / "charts" / "transcription-operator"
NAME = "transcription-operator"
PUSHED_DIGEST = re.compile(r"^Digest: (sha256:[0-9a-f]{64})\s*$", re.M)
OCI = re.compile(r"oci://[a-z0-9][a-z0-9.-]*(:[0-9]+)?(/[a-z0-9][a-z0-9._-]*)+")


class ChartError(RuntimeError):
    """The chart cannot be packaged or pushed; the message says why."""


def _helm(*args: str, helm: Path | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([str(helm or toolchain.helm()), *args], capture_output=True, text=True)
    if out.returncode:
        said = "\n".join(t.strip() for t in (out.stdout, out.stderr) if t.strip())
        raise ChartError(f"helm {args[0]} failed (exit {out.returncode}):\n{said}")
    return out


def chart_versions(chart: Path = CHART) -> tuple[str, str]:
    """The chart's ``version`` and ``appVersion``."""
    text = (chart / "Chart.yaml").read_text()
    version = re.search(r"^version:\s*\"?([^\"\s]+)\"?\s*$", text, re.M)
    app = re.search(r"^appVersion:\s*\"?([^\"\s]+)\"?\s*$", text, re.M)
    if not version or not app:
        raise ChartError(f"{chart / 'Chart.yaml'}: no version or no appVersion")
    return version.group(1), app.group(1)


def package(dest: Path, chart: Path = CHART, version: str | None = None,
            helm: Path | None = None) -> Path:  # fmt: skip
    """``helm lint`` then ``helm package``: the archive, ``<dest>/transcription-operator-
    <version>.tgz``. The chart's version and appVersion must both be ``version`` (default:
    pyproject.toml's)."""
    try:
        version = parse(version or current())
    except VersionError as e:
        raise ChartError(str(e)) from None
    chart_version, app_version = chart_versions(chart)
    if (chart_version, app_version) != (version, version):
        raise ChartError(
            f"the chart says version {chart_version}, appVersion {app_version}; the release is "
            f"{version}: run `python -m release.version set {version}` first"
        )
    _helm("lint", "--quiet", str(chart), helm=helm)
    dest.mkdir(parents=True, exist_ok=True)
    _helm("package", str(chart), "--destination", str(dest), helm=helm)
    archive = dest / f"{NAME}-{version}.tgz"
    if not archive.is_file():
        raise ChartError(f"helm package wrote no {archive}")
    return archive


def pushed_digest(output: str) -> str:
    """The digest ``helm push`` reports (on stderr: ``Digest: sha256:...``)."""
    match = PUSHED_DIGEST.search(output)
    if not match:
        raise ChartError(f"helm push reported no digest; it said:\n{output.strip()}")
    return match.group(1)


def push(archive: Path, remote: str, helm: Path | None = None) -> str:
    """Push the packaged chart to ``remote`` (``oci://<registry>/<namespace>``); the pushed
    chart's reference by digest, ``<registry>/<namespace>/transcription-operator@sha256:...``."""
    if not OCI.fullmatch(remote):
        raise ChartError(
            f"{remote!r} is not oci://<registry>/<namespace> in lowercase "
            "(e.g. oci://ghcr.io/transcription-dev/charts)"
        )
    if not re.fullmatch(rf"{NAME}-[^/]+\.tgz", archive.name) or not archive.is_file():
        raise ChartError(
            f"{archive} is not a packaged {NAME} chart (python -m release.chart package)"
        )
    out = _helm("push", str(archive), remote, helm=helm)
    return f"{remote.removeprefix('oci://')}/{NAME}@{pushed_digest(out.stderr + out.stdout)}"


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("python -m release.chart", __doc__)
    sub = p.add_subparsers(dest="command", required=True)
    pk = sub.add_parser("package", help="lint and package the chart")
    pk.add_argument("dest", type=Path)
    pu = sub.add_parser("push", help="push a packaged chart to an OCI registry")
    pu.add_argument("archive", type=Path)
    pu.add_argument("remote", help="oci://<registry>/<namespace>")
    sub.add_parser("helm", help="the pinned helm binary's path")
    args = p.parse_args(argv)
    commands = {
        "package": lambda: package(args.dest),
        "push": lambda: push(args.archive, args.remote),
        "helm": toolchain.helm,
    }
    return cli.run(lambda: print(commands[args.command]()), ChartError)


if __name__ == "__main__":
    sys.exit(main())
