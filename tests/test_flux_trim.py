"""The test bed's Flux, built from trimmed copies of its controllers and of fluxcd/pkg/auth
(toolchain/flux.py): each edit made where its snippet is, a missing file or snippet refused
by name (the pinned version changed) before anything is written, one `replace` per trimmed
module, and a new cache entry when a trimming changes. The build itself runs in `make test`;
e2e/test_gitops_flux.py runs the controllers it builds."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import toolchain
from toolchain import flux
from toolchain.flux import Edit, Plan


def fake(plan: Plan, root: Path) -> dict[str, str]:
    """A source tree with each file `plan` removes, each snippet it needs and, per edit, a
    kept line and the edit's snippet (for a cut, then a line it cuts and where it ends)."""
    files: dict[str, str] = dict.fromkeys(plan.removed, "package controller\n")
    for path, snippet in plan.needs:
        files[path] = files.get(path, "package decryptor\n") + snippet
    for i, e in enumerate(plan.edits):
        cut = f"// cut {i}\n{e.until or ''}" if e.until or e.to_end else ""
        files[e.path] = files.get(e.path, "package main\n") + f"// kept {i}\n{e.old}{cut}"
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return files


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}


def test_an_edit_replaces_its_snippet_a_cut_up_to_its_end_or_to_the_files_end() -> None:
    text = "a\nb\nc\nd\n"
    assert flux.edit(text, Edit("f.go", "b\n", "B\n"), "f.go") == "a\nB\nc\nd\n"
    assert flux.edit(text, Edit("f.go", "b\n", "X\n", until="d\n"), "f.go") == "a\nX\nd\n"
    assert flux.edit(text, Edit("f.go", "c\n", "end\n", to_end=True), "f.go") == "a\nb\nend\n"


def test_a_snippet_missing_or_found_twice_is_refused_by_name() -> None:
    with pytest.raises(SystemExit, match=r"^m's f.go has no 'x' where one was expected: update"):
        flux.edit("a\n", Edit("f.go", "x"), "m's f.go")
    with pytest.raises(SystemExit, match=r"has 2 'a' where one was expected: update toolchain/"):
        flux.edit("a\na\n", Edit("f.go", "a"), "m's f.go")
    with pytest.raises(SystemExit, match=r"has no 'z' after 'a' where one was expected"):
        flux.edit("a\nb\n", Edit("f.go", "a", until="z"), "m's f.go")


@pytest.mark.parametrize("plan", flux.PLANS, ids=lambda p: p.module.rsplit("/", 1)[-1])
def test_each_edit_is_made_and_each_left_out_file_removed(plan: Plan, tmp_path: Path) -> None:
    before = fake(plan, tmp_path)
    flux.apply(plan, tmp_path)
    after = tree(tmp_path)
    assert sorted(after) == sorted(set(before) - set(plan.removed))
    for i, e in enumerate(plan.edits):
        assert f"// kept {i}\n" in after[e.path]
        assert f"// cut {i}\n" not in after[e.path]
        assert e.old not in after[e.path] or e.old in e.new
        assert e.new in after[e.path]
        assert (e.until or "") in after[e.path]


EDITS = [(p, i) for p in flux.PLANS for i in range(len(p.edits))]


@pytest.mark.parametrize(("plan", "i"), EDITS, ids=[f"{p.module}-{i}" for p, i in EDITS])
def test_a_missing_snippet_is_refused_by_name_and_nothing_is_written(
    plan: Plan, i: int, tmp_path: Path
) -> None:
    e = plan.edits[i]
    fake(plan, tmp_path)
    source = tmp_path / e.path
    source.write_text(source.read_text().replace(e.old, "// gone\n"))
    before = tree(tmp_path)
    where = re.escape(f"{plan.module}'s {e.path} has no ")
    with pytest.raises(SystemExit, match=f"^{where}.*update toolchain/flux.py for the pinned"):
        flux.apply(plan, tmp_path)
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    ("plan", "i"), [(p, i) for p, i in EDITS if p.edits[i].until],
    ids=[f"{p.module}-{i}" for p, i in EDITS if p.edits[i].until],
)  # fmt: skip
def test_a_missing_end_of_a_cut_is_refused_by_name(plan: Plan, i: int, tmp_path: Path) -> None:
    e = plan.edits[i]
    assert e.until
    fake(plan, tmp_path)
    source = tmp_path / e.path
    source.write_text(source.read_text().replace(e.until, "// gone\n"))
    with pytest.raises(SystemExit, match=re.escape(f"{plan.module}'s {e.path} has no ")):
        flux.apply(plan, tmp_path)


def test_a_missing_file_or_signature_is_refused_by_name(tmp_path: Path) -> None:
    fake(flux.SOURCE_PLAN, tmp_path / "source")
    (tmp_path / "source" / flux.SOURCE_PLAN.removed[0]).unlink()
    with pytest.raises(SystemExit, match=f"has no {flux.SOURCE_PLAN.removed[0]}: update"):
        flux.apply(flux.SOURCE_PLAN, tmp_path / "source")
    fake(flux.KUSTOMIZE_PLAN, tmp_path / "kustomize")
    path, signature = flux.KUSTOMIZE_PLAN.needs[0]
    (tmp_path / "kustomize" / path).write_text(
        (tmp_path / "kustomize" / path).read_text().replace(signature, "")
    )
    with pytest.raises(SystemExit, match=re.escape(f"{path} has no 'func New(client")):
        flux.apply(flux.KUSTOMIZE_PLAN, tmp_path / "kustomize")


def test_what_is_left_out_is_named_where_it_is_asked_for() -> None:
    """The errors a left-out feature meets name this build."""
    git = next(e for e in flux.SOURCE_PLAN.edits if e.path == flux.GIT and e.new)
    assert "spec.provider '%s' is left out of the test bed's build" in git.new
    assert "sourcev1.GitProviderGeneric" in git.new and "InvalidProviderConfiguration" in git.new
    main = "".join(e.new for e in flux.SOURCE_PLAN.edits if e.path == flux.MAIN)
    assert "reconciles GitRepository only" in main
    assert all(kind in main for kind in ("HelmRepository", "HelmChart", "Bucket", "OCIRepository"))
    assert "spec.decryption (SOPS) is left out" in flux.DECRYPTOR_HEAD
    providers = "".join(e.new for e in flux.AUTH_PLAN.edits)
    assert 'case "aws", "azure", "gcp":' in providers and "is left out" in providers


def test_flux_trims_its_two_controllers_and_pkg_auth() -> None:
    assert [t.module for t in toolchain.FLUX.trims] == [flux.SOURCE, flux.KUSTOMIZE, flux.AUTH]
    assert [t.recipe for t in toolchain.FLUX.trims] == [flux.recipe(p) for p in flux.PLANS]
    assert toolchain.FLUX.modules == (flux.SOURCE, flux.KUSTOMIZE)  # their CRDs: untrimmed


def test_another_trimming_names_a_new_cache_entry() -> None:
    trims = toolchain.FLUX.trims
    other = (trims[0], dataclasses.replace(trims[1], recipe="trim=other"), trims[2])
    assert dataclasses.replace(toolchain.FLUX, trims=other).dir != toolchain.FLUX.dir
    assert dataclasses.replace(toolchain.FLUX, trims=trims[:2]).dir != toolchain.FLUX.dir
    assert dataclasses.replace(toolchain.FLUX, trims=()).dir != toolchain.FLUX.dir
    assert toolchain.FLUX.dir.name.startswith(f"flux-{toolchain.FLUX.version}-")
    changed = dataclasses.replace(flux.AUTH_PLAN, edits=flux.AUTH_PLAN.edits[:1])
    assert flux.recipe(changed) != flux.recipe(flux.AUTH_PLAN)


def test_each_trimmed_module_gets_its_own_copy_and_replace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def source(tool: toolchain.Tool, module: str | None = None) -> Path:
        d = tmp_path / "cache" / str(module)
        (d / "go.mod").parent.mkdir(parents=True, exist_ok=True)
        (d / "go.mod").write_text(f"module {module}\n")
        (d / "go.mod").chmod(0o444)  # read-only, as the module cache's files are
        return d

    def mark(src: Path) -> None:
        (src / "trimmed").write_text("yes\n")

    tool = dataclasses.replace(
        toolchain.FLUX, trims=tuple(toolchain.Trim(m, mark, "r") for m in ("a.io/x", "b.io/y"))
    )
    monkeypatch.setattr(toolchain, "module_dir", source)
    gomod = toolchain._trimmed(tool, tmp_path / "work")
    replaces = re.findall(r"(?m)^replace (\S+) => (\S+)$", gomod.read_text())
    assert [m for m, _ in replaces] == ["a.io/x", "b.io/y"]
    for module, path in replaces:
        assert Path(path) == tmp_path / "work" / "src" / module
        assert (Path(path) / "trimmed").read_text() == "yes\n"
        assert (Path(path) / "go.mod").read_text() == f"module {module}\n"
    assert gomod.read_text().startswith(toolchain.FLUX.gomod.read_text())
    assert (tmp_path / "work" / "go.sum").exists()


def test_a_source_the_trimming_no_longer_fits_stops_the_build_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Flux version whose main.go changed: the build stops before `go build`, naming the
    file and what to update, and leaves no half-made folder in the cache."""
    cache, source = tmp_path / "cache", tmp_path / "source-controller"
    fake(flux.SOURCE_PLAN, source)
    (source / flux.MAIN).write_text("package main\n")
    monkeypatch.setattr(toolchain, "CACHE", cache)
    monkeypatch.setattr(toolchain, "module_dir", lambda tool, module=None: source)
    with pytest.raises(SystemExit, match=re.escape(f"{flux.SOURCE}'s main.go has no")):
        toolchain._build_one(toolchain.FLUX, ["source-controller"], "[1/1]")
    assert list(cache.iterdir()) == []
