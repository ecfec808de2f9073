"""TranscriptionGateway, the operator's pure side: which deployments a gateway routes
(`select`), what routing does to a deployment's children (`build(..., routed_by)`), and
both statuses (`gateway_status`, a deployment's `gateways` and NotRouted)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from testkit.operator import CFG, T0, deployment
from testkit.resources import make_gateway, make_td
from transcription_api.routes import Routes
from transcription_api.v1alpha1 import (
    Condition,
    GatewayRouting,
    TranscriptionDeployment,
    TranscriptionDeploymentStatus,
    TranscriptionGateway,
)
from transcription_operator.children import build, build_gateway, gateway_routes
from transcription_operator.gateway_status import gateway_status
from transcription_operator.names import INSTANCE_LABEL, NAMESPACE_NAME_LABEL, GatewayRef
from transcription_operator.plan import plan
from transcription_operator.selection import Invalid, Selection, select
from transcription_operator.status import Observed, compute_status, routing_events, status_body

LABEL = {"team": "speech"}
SELECT = {"selector": {"matchLabels": LABEL}}


def td(
    name: str,
    namespace: str = "speech",
    *,
    aliases: tuple[str, ...] = (),
    created: str = "2026-01-01T00:00:00Z",
    labels: dict[str, str] | None = None,
    ready: bool | None = None,
    **spec: Any,
) -> TranscriptionDeployment:
    """A deployment of model `m-<name>`; `ready`: with a Ready condition that says so."""
    body = make_td({"model": {"name": f"m-{name}", "aliases": list(aliases)}, **spec}, name,
                   namespace).model_dump(by_alias=True, exclude_none=True, mode="json")  # fmt: skip
    body["metadata"] |= {"creationTimestamp": created, "labels": LABEL if labels is None else labels,
                         "uid": f"uid-{namespace}-{name}"}  # fmt: skip
    if ready is not None:
        reason = "Ready" if ready else "Unschedulable"
        body["status"] = {"conditions": [{"type": "Ready", "status": str(ready),
                                          "reason": reason, "message": f"{name} is {reason}",
                                          "lastTransitionTime": T0}]}  # fmt: skip
    return TranscriptionDeployment.model_validate(body)


def routed(s: Selection) -> list[str]:
    return [v.ref for v in s.verdicts if v.routed]


# --------------------------------------------------------------------------- select


def test_deployments_are_routed_in_creation_order_then_by_name() -> None:
    gw = make_gateway(SELECT)
    s = select(gw, [td("c", created="2026-01-02T00:00:00Z"), td("b"), td("a")], {})
    assert routed(s) == ["speech/a", "speech/b", "speech/c"]
    assert [t.model for t in gateway_routes(gw, s).deployments] == ["m-a", "m-b", "m-c"]


def test_a_name_claimed_twice_refuses_the_later_deployment_whole_and_names_both() -> None:
    gw = make_gateway(SELECT)
    early = td("early", aliases=("whisper-1",))
    late = td("late", aliases=("other", "whisper-1"), created="2026-02-01T00:00:00Z")
    s = select(gw, [late, early], {})
    assert routed(s) == ["speech/early"]
    refused = s.of("speech", "late")
    assert refused is not None and (refused.routed, refused.reason) == (False, "NameConflict")
    assert "'whisper-1'" in refused.message and "speech/early" in refused.message
    assert "speech/gw" in refused.message
    kept = s.of("speech", "early")
    assert kept is not None and (kept.routed, kept.reason) == (True, "NameConflict")
    assert "speech/late" in kept.message and "'whisper-1'" in kept.message
    # The refused one claims none of its names: `other` is not served either.
    routes = gateway_routes(gw, s)
    assert [t.served_names for t in routes.deployments] == [["m-early", "whisper-1"]]
    assert [(r.deployment, r.reason, r.names) for r in routes.refused] == [
        ("speech/late", "NameConflict", ["m-late", "other", "whisper-1"])
    ]


def test_a_primary_name_conflicts_with_an_alias_too() -> None:
    s = select(make_gateway(SELECT), [td("a", aliases=("m-b",)), td("b")], {})
    assert routed(s) == ["speech/a"]


def test_another_namespace_needs_the_deployments_consent() -> None:
    everywhere = make_gateway({**SELECT, "namespaces": {"from": "All"}})
    refused = td("x", "models")
    s = select(everywhere, [refused], {})
    [v] = s.verdicts
    assert (v.routed, v.reason) == (False, "NotPermitted")
    assert "models/x" in v.message and "speech/gw" in v.message
    assert "spec.allowedGateways" in v.message
    for consent in ({"namespace": "speech"}, {"namespace": "speech", "name": "gw"},
                    {"namespace": "*"}):  # fmt: skip
        assert routed(select(everywhere, [td("x", "models", allowedGateways=[consent])], {})) == [
            "models/x"
        ], consent
    other_gateway = td("x", "models", allowedGateways=[{"namespace": "speech", "name": "edge"}])
    assert routed(select(everywhere, [other_gateway], {})) == []
    # Its pools are qualified with its namespace in the gateway's routes.
    s = select(everywhere, [td("x", "models", allowedGateways=[{"namespace": "*"}]), td("y")], {})
    assert [p.name for t in gateway_routes(everywhere, s).deployments for p in t.pools] == [
        "models/x/default", "y/default",
    ]  # fmt: skip


def test_a_gateway_looks_in_its_own_namespace_by_default() -> None:
    s = select(make_gateway(SELECT), [td("x", "models", allowedGateways=[{"namespace": "*"}])], {})
    assert s.verdicts == () and s.where == "namespace speech"


def test_namespaces_by_label_need_the_namespaces_labels() -> None:
    gw = make_gateway(
        {**SELECT, "namespaces": {"from": "Selector", "selector": {"matchLabels": {"asr": "on"}}}}
    )
    consenting = [td(n, n, allowedGateways=[{"namespace": "speech"}]) for n in ("a", "b")]
    s = select(gw, consenting, {"a": {"asr": "on"}, "b": {}})
    assert routed(s) == ["a/a"]
    # An operator that watches named namespaces may not read them: it says so.
    s = select(gw, consenting, None)
    assert s.verdicts == () and s.problem is not None and s.problem[0] == "NamespacesUnreadable"


def test_label_selectors_and_expressions() -> None:
    gw = make_gateway({"selector": {"matchLabels": {"team": "speech"}, "matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["gold", "silver"]},
        {"key": "legacy", "operator": "DoesNotExist"},
    ]}})  # fmt: skip
    candidates = [
        td("gold", labels={"team": "speech", "tier": "gold"}),
        td("bronze", labels={"team": "speech", "tier": "bronze"}),
        td("old", labels={"team": "speech", "tier": "gold", "legacy": "yes"}),
        td("other", labels={"team": "other", "tier": "gold"}),
    ]
    assert routed(select(gw, candidates, {})) == ["speech/gold"]
    every = make_gateway({"selector": {}})
    assert len(routed(select(every, candidates, {}))) == 4


def test_a_selector_that_selects_nothing_and_deployments_being_deleted() -> None:
    gw = make_gateway({"selector": {"matchLabels": {"team": "nobody"}}})
    assert select(gw, [td("a")], {}).verdicts == ()
    going = td("a").model_copy(update={"metadata": {**td("a").metadata, "deletionTimestamp": T0}})
    assert select(make_gateway(SELECT), [going], {}).verdicts == ()


def test_an_invalid_spec_is_refused_and_claims_no_name() -> None:
    broken = Invalid({"name": "bad", "namespace": "speech", "labels": LABEL,
                      "creationTimestamp": T0}, "invalid spec: model: Field required")  # fmt: skip
    s = select(make_gateway(SELECT), [broken, td("a")], {})
    assert [(v.name, v.routed, v.reason) for v in s.verdicts] == [
        ("a", True, "Routed"), ("bad", False, "InvalidSpec"),
    ]  # fmt: skip
    assert s.of("speech", "bad") is not None


def test_gateway_specs_are_checked_by_the_twins_of_their_cel_rules() -> None:
    for spec, message in [
        ({**SELECT, "namespaces": {"from": "Selector"}}, "namespaces.selector is required"),
        ({**SELECT, "frontend": {"enabled": False}}, "frontend.enabled cannot be false"),
        ({**SELECT, "pod": {"serviceAccountName": "x"}}, "pod.serviceAccountName does not"),
        ({"selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}, "need values"),
        (
            {
                "selector": {
                    "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
                }
            },
            "take none",
        ),
    ]:
        with pytest.raises(ValidationError, match=message):
            make_gateway(spec)


# --------------------------------------------------------------------------- children


def kinds(manifests: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(m["kind"], m["metadata"]["name"]) for m in manifests}


def by_name(manifests: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(m for m in manifests if (m["kind"], m["metadata"]["name"]) == (kind, name))


HERE, THERE = GatewayRef("speech", "gw"), GatewayRef("edge", "public")


def test_a_deployment_without_its_own_frontend_has_only_workers() -> None:
    alone = td("a", frontend={"enabled": False})
    assert kinds(build(alone, CFG)) == {
        ("Service", "a-default"), ("Deployment", "a-default"), ("NetworkPolicy", "a-workers"),
        ("NetworkPolicy", "a-workers-egress"),
    }  # fmt: skip
    policy = by_name(build(alone, CFG), "NetworkPolicy", "a-workers")
    # No frontend may reach the workers (an empty `from` would admit everyone): scrapers only.
    assert [rule["from"][0].get("namespaceSelector") for rule in policy["spec"]["ingress"]] == [{}]


def test_the_workers_admit_the_frontends_of_the_gateways_that_route_them() -> None:
    policy = by_name(build(td("a"), CFG, routed_by=[HERE, THERE]), "NetworkPolicy", "a-workers")
    frontends = policy["spec"]["ingress"][0]["from"]
    assert frontends == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "a",
                                         "app.kubernetes.io/component": "frontend"}}},
        *({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": g.namespace}},
           "podSelector": {"matchLabels": {"app.kubernetes.io/instance": g.name,
                                           "app.kubernetes.io/component": "frontend"}}}
          for g in (HERE, THERE)),
    ]  # fmt: skip


def test_gateways_of_other_namespaces_may_read_the_endpoint_slices_only() -> None:
    assert not {k for k in kinds(build(td("a"), CFG, routed_by=[HERE])) if k[1] == "a-gateways"}
    manifests = build(td("a"), CFG, routed_by=[HERE, THERE])
    role = by_name(manifests, "Role", "a-gateways")
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                              "verbs": ["get", "list", "watch"]}]  # fmt: skip
    binding = by_name(manifests, "RoleBinding", "a-gateways")
    assert binding["roleRef"]["name"] == "a-gateways"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "public-frontend", "namespace": "edge"}
    ]
    assert role["metadata"]["ownerReferences"][0]["name"] == "a"  # the deployment's


AUTOSCALED = {"pools": [{"name": "p", "autoscaling": {"minReplicas": 0, "maxReplicas": 3}}]}


def triggers(manifests: list[dict[str, Any]]) -> list[tuple[str | None, str, str]]:
    obj = by_name(manifests, "ScaledObject", "a-p")
    return [(t.get("name"), t["metadata"]["scalerAddress"], t["metadata"]["pool"])
            for t in obj["spec"]["triggers"]]  # fmt: skip


def test_an_autoscaled_pool_scales_on_the_sum_of_every_routing_frontend() -> None:
    svc = "svc.cluster.local:9090"
    manifests = build(td("a", **AUTOSCALED), CFG, routed_by=[HERE, THERE])
    assert triggers(manifests) == [
        ("frontend", f"a-scaler.speech.{svc}", "p"),
        ("gateway_speech_gw", f"gw-scaler.speech.{svc}", "a/p"),
        ("gateway_edge_public", f"public-scaler.edge.{svc}", "speech/a/p"),
    ]
    modifiers = by_name(manifests, "ScaledObject", "a-p")["spec"]["advanced"]["scalingModifiers"]
    assert modifiers["formula"] == "frontend + gateway_speech_gw + gateway_edge_public"
    # Each trigger's value is seconds of one replica's work: the sum's target is the pool's.
    metadata = by_name(manifests, "ScaledObject", "a-p")["spec"]["triggers"][0]["metadata"]
    assert modifiers["target"] == metadata["targetQueueSeconds"] == "10"
    # One frontend: one unnamed trigger and no formula, as without gateways.
    only = build(td("a", **AUTOSCALED, frontend={"enabled": False}), CFG, routed_by=[HERE])
    assert triggers(only) == [(None, f"gw-scaler.speech.{svc}", "a/p")]
    assert "scalingModifiers" not in by_name(only, "ScaledObject", "a-p")["spec"]["advanced"]
    # None: nothing would send the pool work, so nothing scales it.
    alone = build(td("a", **AUTOSCALED, frontend={"enabled": False}), CFG)
    assert not [m for m in alone if m["kind"] == "ScaledObject"]


def test_the_gateways_children_and_its_route_table() -> None:
    gw = make_gateway({**SELECT, "frontend": {"replicas": 1, "maxUploadBytes": 4096}})
    s = select(gw, [td("a", aliases=("x",)), td("b")], {})
    manifests = build_gateway(gw, CFG, s)
    assert kinds(manifests) == {
        ("ServiceAccount", "gw-frontend"), ("Role", "gw-frontend"), ("RoleBinding", "gw-frontend"),
        ("ConfigMap", "gw-routes"), ("Service", "gw"), ("Service", "gw-scaler"),
        ("Deployment", "gw-frontend"), ("NetworkPolicy", "gw-frontend-internal"),
        ("NetworkPolicy", "gw-frontend-egress"),
    }  # fmt: skip
    # Outbound, the gateway's frontend reaches the workers of the deployments it routes.
    egress = by_name(manifests, "NetworkPolicy", "gw-frontend-egress")["spec"]["egress"]
    [to_workers] = [
        r["to"] for r in egress if r.get("ports") == [{"protocol": "TCP", "port": 8000}]
    ]
    assert [
        (t["namespaceSelector"]["matchLabels"], t["podSelector"]["matchLabels"][INSTANCE_LABEL])
        for t in to_workers
    ] == [({NAMESPACE_NAME_LABEL: "speech"}, "a"), ({NAMESPACE_NAME_LABEL: "speech"}, "b")]
    for m in manifests:
        assert m["metadata"]["ownerReferences"][0]["kind"] == "TranscriptionGateway"
    routes = Routes.model_validate_json(
        by_name(manifests, "ConfigMap", "gw-routes")["data"]["routes.json"]
    )
    assert routes.max_upload_bytes == 4096
    assert [(t.deployment, t.served_names) for t in routes.deployments] == [
        ("speech/a", ["m-a", "x"]), ("speech/b", ["m-b"]),
    ]  # fmt: skip


# --------------------------------------------------------------------------- status


def conditions(status: Any) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status.value, c.reason) for c in status.conditions}


def gw_status(
    gw: TranscriptionGateway, candidates: list[TranscriptionDeployment], frontend_ready: int = 2
) -> Any:
    frontend = deployment("gw-frontend", gw.spec.frontend.replicas, frontend_ready)
    observed = Observed(deployments={"gw-frontend": frontend})
    return gateway_status(gw, select(gw, candidates, {}), observed, CFG, T0)


@pytest.mark.parametrize(
    ("candidates", "frontend_ready", "expected"),
    [
        (  # every routed deployment ready, and the frontend
            [td("a", ready=True), td("b", ready=True)], 2,
            {"Ready": ("True", "Ready"), "Progressing": ("False", "Complete"),
             "Degraded": ("False", "AsExpected"), "Reconciling": ("False", "Complete"),
             "Stalled": ("False", "AsExpected")},
        ),
        (  # one not ready yet: waiting, in its own words
            [td("a", ready=True), td("b", ready=False)], 2,
            {"Ready": ("False", "DeploymentNotReady"), "Progressing": ("True", "DeploymentNotReady"),
             "Degraded": ("False", "AsExpected")},
        ),
        (  # the frontend rolls out
            [td("a", ready=True)], 0,
            {"Ready": ("False", "NotServing"), "Progressing": ("True", "RollingOut")},
        ),
        (  # a conflict: serving what it routes, Degraded with the conflict
            [td("a", aliases=("x",), ready=True),
             td("b", aliases=("x",), ready=True, created="2026-03-01T00:00:00Z")], 2,
            {"Ready": ("True", "NameConflict"), "Degraded": ("True", "NameConflict"),
             "Stalled": ("True", "NameConflict"), "Progressing": ("False", "NameConflict")},
        ),
        (  # nothing selected
            [td("a", labels={})], 2,
            {"Ready": ("False", "NoDeployments"), "Degraded": ("True", "NoDeployments")},
        ),
        (  # not reported yet
            [td("a")], 2, {"Ready": ("False", "DeploymentNotReady")},
        ),
    ],
)  # fmt: skip
def test_gateway_conditions(
    candidates: list[TranscriptionDeployment], frontend_ready: int, expected: dict[str, Any]
) -> None:
    st = gw_status(make_gateway(SELECT), candidates, frontend_ready)
    got = conditions(st)
    assert {k: got[k] for k in expected} == expected, st.conditions
    assert all(c.observed_generation == 1 for c in st.conditions)


def test_each_selected_deployment_is_listed_in_its_own_words() -> None:
    st = gw_status(make_gateway(SELECT), [
        td("a", aliases=("x",), ready=True), td("b", ready=False),
        td("c", aliases=("x",), created="2026-03-01T00:00:00Z"),
    ])  # fmt: skip
    assert [(d.name, d.routed, d.ready, d.reason, d.models) for d in st.deployments] == [
        ("a", True, True, "Ready", ["m-a", "x"]),
        ("b", True, False, "Unschedulable", ["m-b"]),
        ("c", False, False, "NameConflict", ["m-c", "x"]),
    ]
    assert st.deployments[1].message == "b is Unschedulable"
    assert "speech/b: Unschedulable: b is Unschedulable" in next(
        c.message for c in st.conditions if c.type == "Ready"
    )
    assert st.routed_deployments == "2/3"
    assert st.endpoint == "http://gw.speech.svc.cluster.local/v1"
    assert st.frontend is not None and st.frontend.ready_replicas == 2


def test_a_steady_gateway_gets_an_identical_status() -> None:
    gw = make_gateway(SELECT)
    first = gw_status(gw, [td("a", ready=True)])
    again = gw.model_copy(update={"status": first})
    later = gateway_status(again, select(again, [td("a", ready=True)], {}),
                           Observed(deployments={"gw-frontend": deployment("gw-frontend", 2, 2)}),
                           CFG, "2026-11-30T11:00:00Z")  # fmt: skip
    assert status_body(later) == status_body(first)


def deployment_status(
    d: TranscriptionDeployment, gateways: list[GatewayRouting], endpoint: str | None = None
) -> TranscriptionDeploymentStatus:
    deps = [deployment(f"{d.name}-default", 1, 1), deployment(f"{d.name}-frontend", 2, 2)]
    observed = Observed(deployments={x["metadata"]["name"]: x for x in deps}, gateways=gateways,
                        gateway_endpoint=endpoint)  # fmt: skip
    return compute_status(d, plan(d.spec), observed, CFG, T0)


ROUTED = GatewayRouting(namespace="speech", name="gw", routed=True, reason="Routed",
                        message="routed by gateway speech/gw")  # fmt: skip
REFUSED = GatewayRouting(namespace="edge", name="public", routed=False, reason="NotPermitted",
                         message="TranscriptionDeployment speech/a does not allow gateway "
                         "edge/public")  # fmt: skip


def test_a_deployment_without_its_own_frontend_is_ready_only_while_a_gateway_routes_it() -> None:
    d = td("a", frontend={"enabled": False})
    lonely = deployment_status(d, [REFUSED])
    assert conditions(lonely)["Ready"] == ("False", "NotRouted")
    assert conditions(lonely)["Degraded"] == ("True", "NotRouted")
    ready = next(c for c in lonely.conditions if c.type == "Ready")
    assert "edge/public refuses it" in ready.message and "does not allow" in ready.message
    assert lonely.frontend is None and lonely.endpoint is None
    assert lonely.gateways == [REFUSED]
    served = deployment_status(d, [ROUTED, REFUSED], "http://gw.speech.svc.cluster.local/v1")
    assert conditions(served)["Ready"] == ("True", "Ready")
    assert next(c for c in served.conditions if c.type == "Ready").message == (
        "1 pool(s) are ready, served through gateway speech/gw"
    )
    assert served.endpoint == "http://gw.speech.svc.cluster.local/v1"
    # With its own frontend, a gateway's refusal is said in status.gateways, not a fault.
    own = deployment_status(td("a"), [REFUSED])
    assert conditions(own)["Ready"] == ("True", "Ready") and own.gateways == [REFUSED]


def test_one_warning_per_new_refusal_or_conflict() -> None:
    def entry(reason: str, message: str, name: str = "gw") -> dict[str, Any]:
        return {"namespace": "speech", "name": name, "routed": reason == "Routed",
                "reason": reason, "message": message}  # fmt: skip

    conflict = entry("NameConflict", "'x' is already routed")
    assert routing_events([], [entry("Routed", "ok"), conflict], "gateway ") == [
        ("Warning", "NameConflict", "gateway speech/gw: 'x' is already routed")
    ]
    assert routing_events([conflict], [conflict], "gateway ") == []  # said already
    assert routing_events([conflict], [entry("NameConflict", "'y' too")], "") == [
        ("Warning", "NameConflict", "speech/gw: 'y' too")
    ]
    assert routing_events([conflict], [entry("Routed", "ok")], "") == []


def test_condition_reasons_are_camel_case() -> None:
    st = gw_status(make_gateway(SELECT), [td("a", labels={})])
    for c in st.conditions:
        assert isinstance(c, Condition) and c.reason[0].isupper() and " " not in c.reason
