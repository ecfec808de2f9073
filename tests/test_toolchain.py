"""Two processes that need the same build (toolchain.exclusive): `make test` builds KEDA,
Flux and the checkers beside the e2e suite, whose KEDA fixture may ask for KEDA first. The
second waits, says for whom, and finds the build done; the e2e modules that need those
builds run after the others (testkit.e2e_order)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import toolchain
from testkit import e2e_order

ROOT = Path(__file__).resolve().parent.parent
E2E = ROOT / "e2e"

# Holds the lock as `make test`'s build beside the suite would, until told to stop.
HOLDER = """
import sys, time
from pathlib import Path
import toolchain
lock, ready, stop, make = map(Path, sys.argv[1:5])
with toolchain.exclusive(lock, "a test's build"):
    ready.touch()
    while not stop.exists():
        time.sleep(0.05)
    for binary in sys.argv[5:]:  # what the build made
        make.mkdir(parents=True, exist_ok=True)
        (make / binary).write_text("built by the holder")
"""


def hold(tmp: Path, lock: Path, make: Path | None = None, *binaries: str,
         env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
    """A second process in `exclusive(lock)`, once it has the lock."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock), str(tmp / "ready"), str(tmp / "stop"),
         str(make or tmp), *binaries],
        cwd=ROOT, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (tmp / "ready").exists():
        assert proc.poll() is None, "the holder ended before it held the lock"
        assert time.monotonic() < deadline, "the holder never held the lock"
        time.sleep(0.05)
    return proc


def release_in(tmp: Path, seconds: float) -> None:
    subprocess.Popen(["sh", "-c", f"sleep {seconds}; touch {tmp / 'stop'}"])


def test_a_second_process_waits_for_the_build_and_is_told_who_runs_it(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    lock = tmp_path / "locks" / ".keda.lock"
    holder = hold(tmp_path, lock)
    release_in(tmp_path, 1.0)
    start = time.monotonic()
    with toolchain.exclusive(lock, "keda v2"):
        waited = time.monotonic() - start
        assert lock.read_text() == f"process {os.getpid()} ({toolchain._command()})"
    assert holder.wait(timeout=30) == 0
    assert waited >= 0.8, f"entered after {waited:.2f}s, while the other process held it"
    err = capfd.readouterr().err
    assert re.search(rf"waiting for keda v2: process {holder.pid} \(\S+ -c\) is building it",
                     err), err  # fmt: skip
    assert "ended after" in err
    assert lock.read_text() == "", "a released lock names nobody"


def test_a_free_lock_is_taken_at_once_and_says_nothing(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    lock = tmp_path / ".helm.lock"
    start = time.monotonic()
    with toolchain.exclusive(lock, "helm"):
        pass
    assert time.monotonic() - start < 0.5
    assert "waiting" not in capfd.readouterr().err


def test_a_failed_build_releases_the_lock_for_the_next(tmp_path: Path) -> None:
    lock = tmp_path / ".flux.lock"
    with pytest.raises(SystemExit, match="building flux failed"), toolchain.exclusive(lock, "flux"):
        raise SystemExit("building flux failed (exit 1); see above")
    holder = hold(tmp_path, lock)  # would hang here if the lock were still held
    (tmp_path / "stop").touch()
    assert holder.wait(timeout=30) == 0


def test_a_tool_another_process_built_meanwhile_is_not_built_again(tmp_path: Path) -> None:
    """toolchain.build waits on the tool's lock, then finds its binary: `go` never runs
    (a `go` on PATH that would fail the test if it did)."""
    cache = tmp_path / "cache"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "go").write_text(f"#!/bin/sh\ntouch {tmp_path / 'go-ran'}\nexit 1\n")
    (fake / "go").chmod(0o755)
    env = {**os.environ, "TESTBED_CACHE": str(cache), "PATH": f"{fake}:{os.environ['PATH']}",
           "XDG_CACHE_HOME": str(tmp_path / "xdg")}  # fmt: skip
    tool = toolchain.ACTIONLINT
    entry = cache / tool.dir.name
    holder = hold(tmp_path, cache / f".{tool.name}.lock", entry, "actionlint", env=env)
    release_in(tmp_path, 1.0)
    build = subprocess.run(
        [sys.executable, "-c", "import toolchain; toolchain.build((toolchain.ACTIONLINT,))"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert holder.wait(timeout=30) == 0
    assert build.returncode == 0, build.stderr
    assert f"waiting for actionlint {tool.version}" in build.stderr
    assert not (tmp_path / "go-ran").exists(), build.stderr
    assert (entry / "actionlint").read_text() == "built by the holder"


def test_the_e2e_modules_that_need_the_builds_beside_the_suite_run_last() -> None:
    modules = sorted(p.name for p in E2E.glob("test_*.py"))
    assert set(e2e_order.LAST) <= set(modules), "LAST names a module that is gone"
    ordered = sorted(modules, key=e2e_order.rank)
    assert ordered[-len(e2e_order.LAST) :] == list(e2e_order.LAST)
    assert ordered[: -len(e2e_order.LAST)] == [m for m in modules if m not in e2e_order.LAST]
    # Every module that asks for KEDA, Flux or a torch image is among the last.
    needs = re.compile(r"\bkeda: None\b|cluster\.flux\(|on_demand_image\(")
    late = {p.name for p in E2E.glob("test_*.py") if needs.search(p.read_text())}
    assert late, "the pattern matches no module: it no longer says what it looks for"
    assert late <= set(e2e_order.LAST), sorted(late - set(e2e_order.LAST))


def test_the_e2e_suite_runs_in_that_order() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "e2e", "e2e"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    files = [line.split("::")[0].removeprefix("e2e/") for line in out.splitlines() if "::" in line]
    order = list(dict.fromkeys(files))
    assert order[-len(e2e_order.LAST) :] == list(e2e_order.LAST), textwrap.shorten(str(order), 300)


def test_a_change_to_a_wrappers_own_go_code_names_a_new_cache_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CoreDNS' wrapper has a main.go of its own (the plugins it links): a changed file is a
    new cache entry, built afresh, as a changed version or build flag is."""
    wrapper = tmp_path / "coredns"
    wrapper.mkdir()
    (wrapper / "go.mod").write_text((toolchain.TOOLS / "coredns" / "go.mod").read_text())
    (wrapper / "main.go").write_text("package main\n")
    monkeypatch.setattr(toolchain, "TOOLS", tmp_path)

    def entry() -> str:
        return toolchain.Tool("coredns", toolchain.COREDNS.module, {"coredns": "."}).dir.name

    before = entry()
    assert entry() == before
    (wrapper / "main.go").write_text("package main // one more plugin\n")
    assert entry() != before
    assert entry().startswith(f"coredns-{toolchain.COREDNS.version}-")


def test_a_bumped_indirect_dependency_names_a_new_cache_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tool's own version is unchanged, but go.sum pins another `golang.org/x/net` (an
    advisory's fix, say): the binary links it, so it is built afresh."""
    wrapper = tmp_path / "etcd"
    wrapper.mkdir()
    for name in ("go.mod", "go.sum"):
        (wrapper / name).write_text((toolchain.TOOLS / "etcd" / name).read_text())
    monkeypatch.setattr(toolchain, "TOOLS", tmp_path)

    def entry() -> str:
        return toolchain.Tool("etcd", toolchain.ETCD.module, {"etcd": "."}).dir.name

    before = entry()
    with (wrapper / "go.sum").open("a") as f:
        f.write("golang.org/x/net v9.9.9 h1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n")
    assert entry() != before
    assert entry().startswith(f"etcd-{toolchain.ETCD.version}-")


def test_a_new_build_removes_the_tools_older_entries_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a tool's new entry is built, its older ones (another version, another recipe) go;
    another tool's whose name starts with this one's (kube-router beside a `kube`) stays,
    and so do folders that are not entries."""
    monkeypatch.setattr(toolchain, "CACHE", tmp_path)
    tool = toolchain.Tool("kube", "k8s.io/kubernetes", {"kubectl": "."})
    monkeypatch.setattr(toolchain.Tool, "version", property(lambda self: "v1.36.3"))
    current = tmp_path / "kube-v1.36.3-0123abcd"
    monkeypatch.setattr(toolchain.Tool, "dir", property(lambda self: current))
    older = [tmp_path / "kube-v1.36.3-ffffffff", tmp_path / "kube-v1.35.0-rc.1-00000000"]
    kept = [current, tmp_path / "kube-router-v2.1.0-5d0b2b61", tmp_path / "kube-v1.36.3-notes"]
    for d in (*older, *kept):
        d.mkdir()
        (d / "kubectl").write_bytes(b"x" * 1000)
    assert toolchain.older_entries(tool) == sorted(older)
    toolchain._drop_older(tool)
    assert sorted(p for p in tmp_path.iterdir()) == sorted(kept)


def test_the_compiler_flags_reach_go_and_name_the_cache_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`go build` gets the flags: no DWARF anywhere, no inlining but in the standard library
    (its pattern last: the last match wins); one thread a compiler, as many compilers at once
    as there are CPUs. Other flags name another cache entry, so that a binary built with the
    old ones is never taken for a new one."""
    fake = tmp_path / "bin"
    fake.mkdir()
    args = tmp_path / "args"
    (fake / "go").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        [ "$1" = build ] || exit 0
        printf '%s\\n' "$@" > {args}
        echo "GOMAXPROCS=$GOMAXPROCS" >> {args}
        while [ $# -gt 0 ]; do [ "$1" = -o ] && echo built > "$2"; shift; done
        exit 0
    """))  # fmt: skip
    (fake / "go").chmod(0o755)
    env = {**os.environ, "TESTBED_CACHE": str(tmp_path / "cache"),
           "PATH": f"{fake}:{os.environ['PATH']}", "XDG_CACHE_HOME": str(tmp_path / "xdg")}  # fmt: skip
    build = subprocess.run(
        [sys.executable, "-c", "import toolchain; toolchain.build((toolchain.ACTIONLINT,))"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    argv = args.read_text().splitlines()
    assert [a for a in argv if a.startswith("-gcflags")] == [
        "-gcflags=all=-l -dwarf=false",
        "-gcflags=std=-dwarf=false",
    ]
    assert f"-p={len(os.sched_getaffinity(0))}" in argv and "GOMAXPROCS=1" in argv, argv
    before = toolchain.Tool("actionlint", toolchain.ACTIONLINT.module, {}).dir
    monkeypatch.setattr(toolchain, "GC_FLAGS", ("-gcflags=all=-dwarf=false",))
    assert toolchain.Tool("actionlint", toolchain.ACTIONLINT.module, {}).dir != before
