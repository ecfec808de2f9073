"""The test bed's GitOps pieces that need no cluster: the Git server (with the real `git`),
the Flux controllers' command lines, and the FLUX tool's place among the test bed's tools."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import toolchain
from testbed import gitops

pytestmark = pytest.mark.skipif(not shutil.which("git"), reason="git is not installed")


def test_cgi_environ_passes_the_headers_as_a_web_server_does(tmp_path: Path) -> None:
    env = gitops.cgi_environ(
        "POST", "/fleet.git/git-upload-pack", "",
        {"Content-Type": "application/x-git-upload-pack-request", "Content-Length": "42",
         "Git-Protocol": "version=2", "Content-Encoding": "gzip"},
        tmp_path, "127.0.0.1",
    )  # fmt: skip
    assert env["GIT_PROJECT_ROOT"] == str(tmp_path)
    assert env["GIT_HTTP_EXPORT_ALL"] == "1"
    assert (env["REQUEST_METHOD"], env["PATH_INFO"]) == ("POST", "/fleet.git/git-upload-pack")
    assert env["CONTENT_TYPE"] == "application/x-git-upload-pack-request"
    assert env["CONTENT_LENGTH"] == "42"
    assert env["HTTP_GIT_PROTOCOL"] == "version=2"
    assert env["HTTP_CONTENT_ENCODING"] == "gzip"
    assert "HTTP_CONTENT_TYPE" not in env


def test_parse_cgi_reads_the_status_header_or_means_200() -> None:
    out = b"Status: 403 Forbidden\r\nContent-Type: text/plain\r\n\r\nno"
    assert gitops.parse_cgi(out) == (403, [("Content-Type", "text/plain")], b"no")
    assert gitops.parse_cgi(b"Expires: 0\n\nbody\n\nmore") == (
        200,
        [("Expires", "0")],
        b"body\n\nmore",
    )
    assert gitops.parse_cgi(b"garbage")[0] == 502


def clone(url: str, dest: Path, protocol: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-c", f"protocol.version={protocol}", "clone", "--quiet", url, str(dest)],
        capture_output=True, text=True,
    )  # fmt: skip


def test_the_git_server_serves_each_commit_and_refuses_pushes(tmp_path: Path) -> None:
    with gitops.GitServer(tmp_path / "repos") as server:
        repo = server.repository("fleet")
        first = repo.commit({"apps/a.yaml": "a: 1\n", "apps/b.yaml": "b: 1\n"}, "one")
        for protocol in ("0", "2"):  # go-git speaks v0; git's own client v2
            dest = tmp_path / f"clone-v{protocol}"
            proc = clone(server.url("fleet"), dest, protocol)
            assert proc.returncode == 0, proc.stderr
            assert gitops.git("rev-parse", "HEAD", cwd=dest).strip() == first
        # A commit replaces the whole tree.
        second = repo.commit({"apps/a.yaml": "a: 2\n"}, "two")
        gitops.git("pull", "--quiet", cwd=tmp_path / "clone-v2")
        assert gitops.git("rev-parse", "HEAD", cwd=tmp_path / "clone-v2").strip() == second
        files = sorted(p.name for p in (tmp_path / "clone-v2" / "apps").iterdir())
        assert files == ["a.yaml"]
        push = subprocess.run(
            ["git", "push", "origin", "HEAD:refs/heads/other"], cwd=tmp_path / "clone-v2",
            capture_output=True, text=True,
        )  # fmt: skip
        assert push.returncode != 0 and "403" in push.stderr
        assert "GET /fleet.git/info/refs?service=git-receive-pack -> 403" in server.requests
        url = server.url("fleet")
    # Closed: nothing answers any more.
    assert clone(url, tmp_path / "after", "2").returncode != 0


def test_the_controllers_bind_loopback_without_leader_election(tmp_path: Path) -> None:
    ports = gitops.Ports(9001, 9002, 9003, 9004, 9005)
    cmds = gitops.commands(lambda name: tmp_path / name, tmp_path / "storage", ports)
    assert list(cmds) == list(gitops.CONTROLLERS)
    for name, cmd in cmds.items():
        assert cmd[0] == str(tmp_path / name)
        assert "--enable-leader-election=false" in cmd
        assert "--watch-all-namespaces=true" in cmd
        addrs = [a for a in cmd if a.split("=")[0].endswith("-addr")]
        assert addrs and all(a.split("=", 1)[1].startswith("127.0.0.1:") for a in addrs), addrs
    source = cmds["source-controller"]
    # kustomize-controller downloads from the address source-controller advertises.
    assert "--storage-addr=127.0.0.1:9001" in source
    assert "--storage-adv-addr=127.0.0.1:9001" in source
    assert f"--storage-path={tmp_path / 'storage'}" in source
    ports_used = [a.rsplit(":", 1)[1] for c in cmds.values() for a in c if "-addr=" in a]
    assert sorted(set(ports_used)) == ["9001", "9002", "9003", "9004", "9005"]


def test_flux_is_built_for_the_tests_not_for_the_cluster() -> None:
    assert toolchain.FLUX in toolchain.ALL_TOOLS and toolchain.FLUX not in toolchain.CLUSTER_TOOLS
    # `go build` names each binary after its package: the modules' roots.
    assert {b: p.rsplit("/", 1)[1] for b, p in toolchain.FLUX.binaries.items()} == {
        "source-controller": "source-controller",
        "kustomize-controller": "kustomize-controller",
    }
    gomod = toolchain.FLUX.gomod
    versions = {m: toolchain.pinned_version(gomod, m) for m in toolchain.FLUX.modules}
    assert len(set(versions.values())) == 1, f"one Flux release, both controllers: {versions}"
    # The cache entry names both versions: a bump of either rebuilds.
    assert toolchain.FLUX.dir.name.startswith(f"flux-{toolchain.FLUX.version}-")


def test_leftovers_are_only_flux_binaries_under_the_cache(tmp_path: Path) -> None:
    assert gitops.leftovers(tmp_path) == {}
