"""toolchain.align: one version of each module across the Go wrappers of a group, so that
the test bed's Go builds share their compiled packages."""

from __future__ import annotations

import shutil

import pytest

from toolchain import align
from toolchain.align import Selected


def test_module_versions_order_as_go_orders_them() -> None:
    order = [
        "v0.0.0-20230124172434-306776ec8161",  # a pseudo-version before any release
        "v1.36.12-0.20260120151049-f2248ac996af",  # a pre-release of v1.36.12
        "v1.36.12",
        "v1.37.0-rc.1",
        "v1.37.0-rc.2",
        "v1.37.0",
        "v1.37.1",
        "v1.38.0",
        "v29.6.1+incompatible",
    ]
    assert sorted(reversed(order), key=align.semver_key) == order
    assert align.semver_key("v1.1.13-0.20220915233716-71ac16282d12") > align.semver_key("v1.1.12")


def test_a_version_go_would_refuse_is_named() -> None:
    with pytest.raises(ValueError, match="not a module version: 'latest'"):
        align.semver_key("latest")


def test_the_group_takes_each_modules_highest_version() -> None:
    lists = {
        "kwok": {"golang.org/x/net": Selected("v0.51.0", False), "k8s.io/api": Selected("v0.36.1", False)},
        "keda": {"golang.org/x/net": Selected("v0.58.0", False), "k8s.io/api": Selected("v0.36.4", False)},
    }  # fmt: skip
    best = align.targets(lists)
    assert best == {"golang.org/x/net": "v0.58.0", "k8s.io/api": "v0.36.4"}
    assert align.raises(lists["kwok"], best=best) == {
        "golang.org/x/net": ("v0.51.0", "v0.58.0"),
        "k8s.io/api": ("v0.36.1", "v0.36.4"),
    }
    assert align.raises(lists["keda"], best=best) == {}


def test_a_tools_own_replace_is_kept_and_its_module_left_out_but_a_k8s_one_moves() -> None:
    """Flux's replace of go-digest is its release's pin: nobody is raised to it nor from it.
    A version-only replace of a k8s.io module (Kubernetes' staging) moves with the group."""
    lists = {
        "flux": {
            "github.com/opencontainers/go-digest": Selected("v1.0.1-0.20220411205349-bde1", True),
            "k8s.io/client-go": Selected("v0.36.3", True),
        },
        "kwok": {
            "github.com/opencontainers/go-digest": Selected("v1.0.0", False),
            "k8s.io/client-go": Selected("v0.36.4", False),
        },
    }
    best = align.targets(lists)
    assert best == {"k8s.io/client-go": "v0.36.4"}
    assert align.raises(*lists.values(), best=best) == {"k8s.io/client-go": ("v0.36.3", "v0.36.4")}


def test_a_wrapper_counts_the_higher_of_its_go_mod_line_and_its_build_list() -> None:
    """go.mod may name a module lower than a dependency makes Go select: both are raised to
    the group's version, so that the go.mod files alone show the group is aligned."""
    line = {"golang.org/x/sys": Selected("v0.40.0", False)}
    built = {"golang.org/x/sys": Selected("v0.47.0", False)}
    assert align.merged(line, built) == built
    best = {"golang.org/x/sys": "v0.47.0"}
    assert align.raises(line, built, best=best) == {"golang.org/x/sys": ("v0.40.0", "v0.47.0")}


def test_go_mod_files_that_name_two_versions_of_a_module_disagree() -> None:
    declared = {
        "helm": {"golang.org/x/net": Selected("v0.57.0", False),
                 "github.com/fatih/color": Selected("v1.13.0", False)},
        "coredns": {"golang.org/x/net": Selected("v0.60.0", False)},
    }  # fmt: skip
    assert align.disagreements(declared) == {
        "golang.org/x/net": {"helm": "v0.57.0", "coredns": "v0.60.0"}
    }
    declared["helm"]["golang.org/x/net"] = Selected("v0.60.0", False)
    assert align.disagreements(declared) == {}


@pytest.mark.skipif(not shutil.which("go"), reason="reads the wrappers with `go mod edit -json`")
@pytest.mark.parametrize("group", align.GROUPS, ids="+".join)
def test_the_wrappers_of_each_group_name_one_version_of_each_module(group: tuple[str, ...]) -> None:
    """What `python -m toolchain.align` wrote is still true: after a tool's version bump,
    run it again (a bump alone would compile that tool's packages on their own again)."""
    tools = {t.name: t for g in align.groups() for t in g}
    declared = {name: align.declared(tools[name]) for name in group}
    assert all(declared.values())
    assert align.disagreements(declared) == {}
