"""`testbed down` keeps the last run's logs (testbed.cluster.keep_logs): the control
plane's and the real node's, moved aside before their directories are removed."""

from __future__ import annotations

from pathlib import Path

from testbed.cluster import keep_logs


def logs_of_a_run(cache: Path, text: str) -> tuple[Path, Path]:
    cluster = cache / "kwok" / "clusters" / "tb" / "logs"
    node = cache / "node" / "logs"
    for d, name in ((cluster, "kube-apiserver.log"), (node, "kubelet.log")):
        d.mkdir(parents=True)
        (d / name).write_text(text)
    return cluster, node


def test_both_sets_are_moved_and_replace_the_previous_runs(tmp_path: Path) -> None:
    logs_of_a_run(tmp_path, "first run\n")
    assert keep_logs(tmp_path, "tb") == tmp_path / "last-logs"
    cluster, node = logs_of_a_run(tmp_path, "second run\n")
    with (node / "kubelet.log").open("a") as still_running:  # a daemon not stopped yet
        kept = keep_logs(tmp_path, "tb")
        still_running.write("written after the move\n")
    assert kept == tmp_path / "last-logs"
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*.log")) == [
        "cluster/kube-apiserver.log",
        "node/kubelet.log",
    ]
    assert (kept / "cluster" / "kube-apiserver.log").read_text() == "second run\n"
    assert (kept / "node" / "kubelet.log").read_text() == "second run\nwritten after the move\n"
    assert not cluster.exists() and not node.exists()


def test_a_down_with_nothing_up_leaves_the_kept_logs_alone(tmp_path: Path) -> None:
    logs_of_a_run(tmp_path, "the failed run\n")
    kept = keep_logs(tmp_path, "tb")
    assert kept is not None
    assert keep_logs(tmp_path, "tb") is None  # a second `down`: no logs of a running bed
    assert (kept / "node" / "kubelet.log").read_text() == "the failed run\n"


def test_only_the_nodes_logs_when_the_control_plane_never_started(tmp_path: Path) -> None:
    (tmp_path / "node" / "logs").mkdir(parents=True)
    (tmp_path / "node" / "logs" / "containerd.log").write_text("x")
    kept = keep_logs(tmp_path, "tb")
    assert kept is not None
    assert [p.name for p in kept.iterdir()] == ["node"]


def test_the_node_of_another_cluster_keeps_its_logs(tmp_path: Path) -> None:
    """A `down` of this cluster while the real node belongs to another, still running."""
    cluster, node = logs_of_a_run(tmp_path, "x")
    kept = keep_logs(tmp_path, "tb", node=False)
    assert kept is not None
    assert [p.name for p in kept.iterdir()] == ["cluster"]
    assert not cluster.exists() and (node / "kubelet.log").exists()
