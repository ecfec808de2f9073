"""The one version source, and every place that repeats it.

``pyproject.toml``'s ``project.version`` is the version. The chart's ``version`` and
``appVersion``, the image tags (the chart's default images, ``install.yaml``, the operator's
defaults), the Python ``VERSION`` constants, the CUDA Dockerfile's pin of the wheel it installs,
the golden manifests and the docs repeat it; ``check`` finds them all and fails when one
disagrees (``tests/test_release.py`` runs it), ``set`` stamps a new version into all of them
(the release workflow runs it on a tag; a release PR runs it by hand). The registry the
images live in (``ghcr.io/<owner>``) is stamped and checked the same way.

    python -m release.version                      the version
    python -m release.version check                exit 1 unless every place agrees
    python -m release.version set 0.2.0 [--registry ghcr.io/OWNER]
    python -m release.version from-tag v0.2.0      the version a tag names (exit 2 if none)
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from release import cli
from release.images import RELEASED

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "pyproject.toml"
# MAJOR.MINOR.PATCH with an optional pre-release: valid SemVer (Helm, image tags) whose
# PEP 440 reading is the same version (0.2.0-rc.1 is 0.2.0rc1).
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-(alpha|beta|rc)\.(0|[1-9]\d*))?")
FORMAT = "MAJOR.MINOR.PATCH or MAJOR.MINOR.PATCH-(alpha|beta|rc).N, e.g. 0.2.0 or 0.2.0-rc.1"

# A registry (host, optional port and namespace), as GHCR and Docker spell them: lowercase.
_REGISTRY = r"[a-z0-9][a-z0-9.-]*(?::[0-9]+)?(?:/[a-z0-9][a-z0-9._-]*)*"
_names = "|".join(sorted(RELEASED, key=len, reverse=True))  # worker-vllm-cpu before worker-vllm
# A reference to a released image: <registry>/<name>[:<version>] (charts/render_install.py
# pins them by digest).
IMAGE_REF = (
    rf"(?<![\w./-])(?P<registry>{_REGISTRY}?)"
    rf"/(?P<name>{_names})(?![\w-])(?::(?P<version>[0-9](?:[\w.+-]*\w)?))?"
)


class VersionError(ValueError):
    """A version, tag or registry that cannot be released, or places that disagree."""


@dataclass(frozen=True)
class Place:
    """Where the version (or the registry) is repeated: files, by glob from the repository
    root, and a pattern whose ``version`` and ``registry`` groups are the repeated values."""

    globs: tuple[str, ...]
    pattern: str
    what: str  # what it is, for the errors
    at_least: int = 1  # matches across the files

    def files(self, root: Path) -> list[Path]:
        return sorted({p for g in self.globs for p in root.glob(g)})


# The Dockerfiles that pin the project's wheel they install (the others install the source
# they copy, whatever its version).
DOCKERFILES = ("worker_image/Dockerfile.cuda",)
CHART = "charts/transcription-operator"
PLACES = (
    Place((SOURCE,), r'^version = "(?P<version>[^"]*)"$', "project.version (the source)"),
    Place((f"{CHART}/Chart.yaml",), r"^version: (?P<version>\S+)$", "the chart's version"),
    Place(
        (f"{CHART}/Chart.yaml",), r'^appVersion: "(?P<version>[^"]*)"$', "the chart's appVersion"
    ),
    # image.repository (no tag: the appVersion) and the six defaultImages.
    Place((f"{CHART}/values.yaml",), IMAGE_REF, "the chart's images", at_least=7),
    Place((f"{CHART}/README.md",), IMAGE_REF, "the chart README's default images", at_least=6),
    Place(("install.yaml",), IMAGE_REF, "install.yaml's images", at_least=7),
    Place(
        ("install.yaml",),
        r'app\.kubernetes\.io/version: "?(?P<version>[^"\s]+)"?$',
        "install.yaml's app.kubernetes.io/version labels",
    ),
    Place(
        ("install.yaml",),
        r"helm\.sh/chart: transcription-operator-(?P<version>\S+)$",
        "install.yaml's helm.sh/chart labels",
    ),
    Place(
        ("operator/transcription_operator/config.py",),
        r'^VERSION = "(?P<version>[^"]*)"$',
        "the operator's VERSION",
    ),
    Place(
        ("operator/transcription_operator/config.py",),
        r'^REGISTRY = "(?P<registry>[^"]*)"$',
        "the operator's REGISTRY",
    ),
    Place(
        ("frontend_image/transcription_frontend/app.py",),
        r'FastAPI\(\s*title="[^"]*",\s*version="(?P<version>[^"]*)"',
        "the gateway's OpenAPI version",
    ),
    Place(
        DOCKERFILES,
        r'"transcription-operator\[\w+\]==(?P<version>[^"\s]+)"',
        "the CUDA Dockerfile's pin of the project's wheel",
        at_least=len(DOCKERFILES),
    ),
    Place(("tests/golden/*.yaml",), IMAGE_REF, "the golden manifests' images"),
    Place(("e2e/test_chart.py",), IMAGE_REF, "the chart test's default image"),
    Place(
        ("docs/install.md",),
        rf"(?<![\w./-])(?P<registry>{_REGISTRY}?)/\*:(?P<version>[0-9](?:[\w.+-]*\w)?)",
        "the install docs' default images",
    ),
    Place(("docs/install.md",), r"^VERSION=(?P<version>\S+)$", "the install docs' VERSION="),
    Place(("docs/install.md",), IMAGE_REF, "the install docs' images"),
)


@dataclass(frozen=True)
class Found:
    path: Path
    line: int
    group: str  # "version" or "registry"
    value: str
    start: int  # offsets in the file's text
    end: int
    place: Place


def parse(version: str) -> str:
    """``version`` when it can be released; a VersionError that says why otherwise."""
    if not SEMVER.fullmatch(version):
        hint = " (drop the leading v: tags are v<version>)" if version.startswith("v") else ""
        raise VersionError(f"version {version!r} is not {FORMAT}{hint}")
    return version


def from_tag(tag: str) -> str:
    """The version a release tag names: ``v0.2.0`` -> ``0.2.0``."""
    name = tag.removeprefix("refs/tags/")
    if not name.startswith("v"):
        raise VersionError(f"tag {tag!r} is not a release tag: release tags are v<version>")
    try:
        return parse(name[1:])
    except VersionError as e:
        raise VersionError(f"tag {tag!r} is not v<version>: {e}") from None


def parse_registry(registry: str) -> str:
    if not re.fullmatch(_REGISTRY, registry):
        raise VersionError(
            f"registry {registry!r} is not <host>[/<namespace>] in lowercase, "
            "e.g. ghcr.io/transcription-dev"
        )
    return registry


def current(root: Path = ROOT) -> str:
    """The version: ``project.version`` in pyproject.toml."""
    source = root / SOURCE
    match = re.search(PLACES[0].pattern, source.read_text(), re.M)
    if not match:
        raise VersionError(f'{source}: no project.version (a line `version = "..."`)')
    return match.group("version")


def find(root: Path = ROOT) -> Iterator[Found]:
    """Every repeated value; a VersionError when a place is gone (its pattern is stale)."""
    for place in PLACES:
        count = 0
        for path in place.files(root):
            text = path.read_text()
            for m in re.finditer(place.pattern, text, re.M):
                count += 1
                for group in ("version", "registry"):
                    if group in m.groupdict() and m.group(group) is not None:
                        yield Found(
                            path, text.count("\n", 0, m.start(group)) + 1, group,
                            m.group(group), m.start(group), m.end(group), place,
                        )  # fmt: skip
        if count < place.at_least:
            raise VersionError(
                f"{', '.join(place.globs)}: {place.what} found {count} time(s), expected at "
                f"least {place.at_least}; if they moved, update PLACES in release/version.py"
            )


def check(root: Path = ROOT) -> list[str]:
    """What disagrees with pyproject.toml's version (and with the operator's registry), one
    line each; empty when everything agrees."""
    version = current(root)
    problems = []
    try:
        parse(version)
    except VersionError as e:
        problems.append(f"{SOURCE}: {e}")
    found = list(find(root))
    registries = [f for f in found if f.group == "registry"]
    registry = next(
        (f.value for f in registries if f.path.name == "config.py"), registries[0].value
    )
    for f in found:
        want = version if f.group == "version" else registry
        if f.value != want:
            source = SOURCE if f.group == "version" else "the operator's REGISTRY"
            problems.append(
                f"{f.path.relative_to(root)}:{f.line}: {f.place.what}: {f.group} {f.value}, "
                f"but {source} says {want}"
            )
    return problems


def stamp(version: str, registry: str | None = None, root: Path = ROOT) -> list[Path]:
    """Write ``version`` (and ``registry``) into every place; return the files changed."""
    new = {"version": parse(version)}
    if registry is not None:
        new["registry"] = parse_registry(registry)
    edits: dict[Path, list[Found]] = {}
    for f in find(root):
        if f.group in new:
            edits.setdefault(f.path, []).append(f)
    changed = []
    for path, found in edits.items():
        text = original = path.read_text()
        # From the end, so that earlier offsets stay valid; one span is edited once.
        for f in sorted({(f.start, f.end): f for f in found}.values(), key=lambda f: -f.start):
            text = text[: f.start] + new[f.group] + text[f.end :]
        if text != original:
            path.write_text(text)
            changed.append(path)
    return sorted(changed)


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("python -m release.version", __doc__)
    sub = p.add_subparsers(dest="command")
    sub.add_parser("check", help="exit 1 unless every place agrees with pyproject.toml")
    s = sub.add_parser("set", help="stamp a version into every place")
    s.add_argument("version")
    s.add_argument("--registry", help="also move the images to this registry (ghcr.io/OWNER)")
    t = sub.add_parser("from-tag", help="the version a release tag (v<version>) names")
    t.add_argument("tag")
    args = p.parse_args(argv)

    def command() -> int:
        if args.command == "check":
            problems = check()
            for line in problems:
                print(line, file=sys.stderr)
            if problems:
                print("run `python -m release.version set <version>`", file=sys.stderr)
                return 1
            print(f"{current()}: every place agrees")
        elif args.command == "set":
            for path in stamp(args.version, args.registry):
                print(f"stamped {path.relative_to(ROOT)}", file=sys.stderr)
        elif args.command == "from-tag":
            print(from_tag(args.tag))
        else:
            print(current())
        return 0

    return cli.run(command, VersionError)


if __name__ == "__main__":
    sys.exit(main())
