"""One version of each module across the wrappers of a group, so that the Go builds share
their compiled packages.

Every tool builds in one Go build cache (`toolchain.GO_CACHE`), but a package compiled for
one tool is reused by another only when the two build it from the same module version with
the same versions of everything below it. KWOK, KEDA and Flux all compile `k8s.io/client-go`
v0.36.x; Helm, CoreDNS, containerd and promtool share v0.37.x, gRPC, protobuf and
OpenTelemetry. Their releases each pin slightly different patch versions, so each compiled
its own copy. Here each wrapper of a group requires, for every module its build list has,
the highest version any wrapper of that group selects (Go's minimal version selection can
only go up): the version one of the tools was released with, and nothing in between.

    python -m toolchain.align          # rewrite the wrappers' go.mod and go.sum
    python -m toolchain.align --check  # exit 1, naming the modules, when they differ

A wrapper's version-only `replace` of a module outside `k8s.io/` is a pin its tool's own
go.mod carries (Flux's kustomize, go-digest): kept, and that module left out of the group.
Kubernetes' staging modules are `replace`d to their published versions (its wrapper's
go.mod says why); those replaces move with the group.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass

from toolchain import ALL_TOOLS, TOOLS, Tool, go_env, say

# Build order decides who compiles first; sharing needs only one version per group. The
# Kubernetes wrapper stays out: its staging modules must match k8s.io/kubernetes' own
# release (v1.36.3; the proxy has no v1.36.4), and raising its 71 other modules (cel-go
# v0.26 to v0.31 among them) is a different Kubernetes than the one released.
GROUPS: tuple[tuple[str, ...], ...] = (
    ("kwok", "keda", "flux"),
    ("helm", "coredns", "containerd", "prometheus"),
)

_VERSION = re.compile(r"^v(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+incompatible)?$")


def semver_key(version: str) -> tuple[int, int, int, int, tuple[tuple[int, int | str], ...]]:
    """Go's module version order: a release after its pre-releases (pseudo-versions included),
    pre-release identifiers compared numerically when numeric."""
    m = _VERSION.match(version)
    if not m:
        raise ValueError(f"not a module version: {version!r}")
    major, minor, patch, pre = m.groups()
    parts = tuple((0, int(p)) if p.isdigit() else (1, p) for p in (pre.split(".") if pre else ()))
    return int(major), int(minor), int(patch), 0 if pre else 1, parts


@dataclass(frozen=True)
class Selected:
    """A module in one wrapper's build list: its version and whether a replace pins it."""

    version: str
    replaced: bool  # a version-only replace in the wrapper's go.mod


def build_list(tool: Tool) -> dict[str, Selected]:
    """The modules whose packages the tool's binaries compile, replaces applied (the rest of
    its module graph is never compiled: raising it would share nothing)."""
    fmt = "{{with .Module}}{{.Path}} {{.Version}}{{with .Replace}} {{.Path}} {{.Version}}{{end}}{{end}}"
    out = subprocess.run(
        ["go", "list", "-mod=mod", "-deps", "-f", fmt, *tool.tag_flags, *tool.binaries.values()],
        cwd=TOOLS / tool.name, env=go_env(), capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    selected: dict[str, Selected] = {}
    for line in set(out.split("\n")):
        match line.split():
            case [path, version]:
                selected[path] = Selected(version, False)
            case [path, _, new_path, version] if new_path == path:
                selected[path] = Selected(version, True)
            case _:
                pass  # the standard library, the wrapper itself, or a folder replacing it
    return selected


def declared(tool: Tool) -> dict[str, Selected]:
    """What the wrapper's go.mod requires (and version-only replaces), read offline."""
    out = subprocess.run(["go", "mod", "edit", "-json"], cwd=TOOLS / tool.name, env=go_env(),
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    mod = json.loads(out)
    pins: dict[str, Selected] = {
        r["Path"]: Selected(r["Version"], False) for r in mod.get("Require") or []
    }
    for r in mod.get("Replace") or []:
        old, new = r["Old"], r["New"]
        if new["Path"] == old["Path"] and new.get("Version") and not old.get("Version"):
            pins[old["Path"]] = Selected(new["Version"], True)
    return pins


def pinned(path: str, selected: Selected) -> bool:
    """A replace outside k8s.io/ is the tool's own pin: it stays, the module is not shared."""
    return selected.replaced and not path.startswith("k8s.io/")


def merged(*lists: dict[str, Selected]) -> dict[str, Selected]:
    """One wrapper's modules: its go.mod's lines and its build list, the higher version of
    each (a replace marks the module whichever list names it)."""
    out: dict[str, Selected] = {}
    for sel in lists:
        for path, s in sel.items():
            if path not in out:
                out[path] = s
            else:
                high = max(out[path].version, s.version, key=semver_key)
                out[path] = Selected(high, out[path].replaced or s.replaced)
    return out


def targets(lists: dict[str, dict[str, Selected]]) -> dict[str, str]:
    """The highest version each module has in any wrapper of the group, for the modules no
    wrapper pins."""
    held = {p for sel in lists.values() for p, s in sel.items() if pinned(p, s)}
    best: dict[str, str] = {}
    for sel in lists.values():
        for path, s in sel.items():
            if path in held:
                continue
            if path not in best or semver_key(s.version) > semver_key(best[path]):
                best[path] = s.version
    return best


def raises(*lists: dict[str, Selected], best: dict[str, str]) -> dict[str, tuple[str, str]]:
    """The modules one wrapper declares or builds at another version than the group's:
    path -> (now, then)."""
    return {
        path: (s.version, best[path])
        for sel in lists
        for path, s in sel.items()
        if path in best and s.version != best[path]
    }


def disagreements(declared_by_tool: dict[str, dict[str, Selected]]) -> dict[str, dict[str, str]]:
    """The modules that the go.mod files of one group name at more than one version (pins
    aside): module -> {tool: version}. Empty once the group is aligned."""
    best = targets(declared_by_tool)
    out: dict[str, dict[str, str]] = {}
    for tool, sel in declared_by_tool.items():
        for path, s in sel.items():
            if path in best:
                out.setdefault(path, {})[tool] = s.version
    return {p: v for p, v in out.items() if len(set(v.values())) > 1}


def _edit(tool: Tool, pins: dict[str, Selected], up: dict[str, tuple[str, str]]) -> None:
    args = [
        f"-replace={p}={p}@{v}" if p in pins and pins[p].replaced else f"-require={p}@{v}"
        for p, (_, v) in sorted(up.items())
    ]
    subprocess.run(["go", "mod", "edit", *args], cwd=TOOLS / tool.name, env=go_env(), check=True)


def _fill_sums(tool: Tool) -> None:
    """Load the binaries' packages once, so that go.sum names every module the build reads
    (a build that had to add one would change the cache entry's name mid-run)."""
    subprocess.run(["go", "list", "-mod=mod", "-deps", *tool.tag_flags, *tool.binaries.values()],
                   cwd=TOOLS / tool.name, env=go_env(), capture_output=True, check=True)  # fmt: skip


def groups() -> list[list[Tool]]:
    by_name = {t.name: t for t in ALL_TOOLS}
    return [[by_name[n] for n in group] for group in GROUPS]


def check() -> int:
    """Offline: exit status 1, naming them, when a group's go.mod files disagree."""
    bad = 0
    for tools in groups():
        for path, versions in sorted(disagreements({t.name: declared(t) for t in tools}).items()):
            say(f"{path}: {', '.join(f'{t} {v}' for t, v in versions.items())}", "align")
            bad += 1
    if bad:
        say(f"{bad} modules at more than one version: run `python -m toolchain.align`", "align")
    return 1 if bad else 0


def align() -> None:
    """Raise every wrapper of each group to the group's versions, until they settle."""
    for tools in groups():
        names = ", ".join(t.name for t in tools)
        for _ in range(10):  # a raised module can require higher versions of others
            pins = {t.name: declared(t) for t in tools}
            built = {t.name: build_list(t) for t in tools}
            best = targets({n: merged(pins[n], built[n]) for n in pins})
            ups = {n: raises(pins[n], built[n], best=best) for n in pins}
            if not any(ups.values()):
                say(f"{names}: one version of each of {len(best)} modules", "align")
                break
            for t in tools:
                if up := ups[t.name]:
                    shown = ", ".join(f"{p} {a} -> {b}" for p, (a, b) in sorted(up.items()))
                    say(f"{t.name}: {len(up)} to raise: {shown}", "align")
                    _edit(t, pins[t.name], up)
                    _fill_sums(t)
        else:
            raise SystemExit(f"{names}: the versions did not settle in 10 rounds")


if __name__ == "__main__":
    if "--check" in sys.argv[1:]:
        sys.exit(check())
    align()
