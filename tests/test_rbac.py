"""The chart's RBAC is exactly what the operator's kind registry needs: nothing missing
(a child kind added to the registry but not to the chart fails here, not in a cluster),
nothing more (least privilege)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from testkit.resources import make_td
from transcription_operator.children import frontend_rbac
from transcription_operator.kinds import CHILDREN, KINDS, leader_election_rules, rbac_rules
from transcription_operator.main import LEASE_NAME

ROOT = Path(__file__).resolve().parents[1]
Grant = tuple[str, str, str, tuple[str, ...]]  # group, resource, verb, resource names


def grants(rules: list[dict[str, Any]]) -> set[Grant]:
    return {
        (g, r, v, tuple(rule.get("resourceNames") or ()))
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def covered(grant: Grant, held: set[Grant]) -> bool:
    g, r, v, _ = grant
    return (g, r, v, ()) in held or grant in held


def needed() -> set[Grant]:
    """The registry's rules, plus what the operator grants to the Roles it creates (RBAC
    lets it grant only what it holds)."""
    own = grants(rbac_rules())
    td = make_td({"model": {"name": "m"}})
    granted = grants([r for m in frontend_rbac(td) if m["kind"] == "Role" for r in m["rules"]])
    return own | {g for g in granted if not covered(g, own)}


def install_docs() -> list[dict[str, Any]]:
    """install.yaml: the chart rendered with default values (a test on the test bed keeps
    the two in sync)."""
    return [d for d in yaml.safe_load_all((ROOT / "install.yaml").read_text()) if d]


def chart_rules() -> list[dict[str, Any]]:
    """The operator's ClusterRole in install.yaml."""
    docs = install_docs()
    role = next(
        d
        for d in docs
        if d["kind"] == "ClusterRole" and not d["metadata"]["name"].endswith("-crds")
    )
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def test_chart_rbac_is_exactly_what_the_registry_needs() -> None:
    chart = grants(chart_rules())
    assert sorted(needed() - chart) == [], "the chart lacks these"
    assert sorted(chart - needed()) == [], "the chart grants more than the operator needs"


def test_leader_election_may_touch_only_its_lease_in_its_own_namespace() -> None:
    docs = install_docs()
    [role] = [d for d in docs if d["kind"] == "Role"]
    [binding] = [d for d in docs if d["kind"] == "RoleBinding"]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    ns = deployment["metadata"]["namespace"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == ns
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    # The Lease the operator is told to use is the one it may read and renew.
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    [name] = [a.split("=", 1)[1] for a in args if a.startswith("--leader-elect-resource-name=")]
    assert name == LEASE_NAME
    assert grants(role["rules"]) == grants(leader_election_rules(name))
    assert (
        KINDS["Lease"].path("ns", name)
        == f"/apis/coordination.k8s.io/v1/namespaces/ns/leases/{name}"
    )


def test_every_registered_kind_has_a_path_the_client_uses() -> None:
    for kind in CHILDREN:
        assert KINDS[kind.kind] is kind
        assert kind.path("ns", "x").endswith(f"/namespaces/ns/{kind.plural}/x")
    assert KINDS["Deployment"].path(None) == "/apis/apps/v1/deployments"
    assert KINDS["Service"].path("ns") == "/api/v1/namespaces/ns/services"
