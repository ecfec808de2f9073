"""The Helm chart: lint, rendered templates, install/upgrade on the test bed, RBAC proven by
running the operator with exactly the chart's ServiceAccount, and PodSecurity admission."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import testbed.cluster
from testbed.kube import CHART, CRD_FILE, GATEWAY_CRD_FILE, ROOT, SAMPLES, helm, wait_ready
from testbed.kubectl import Kubectl
from testbed.operators import OperatorProcess

RELEASE, SYSTEM_NS = "transcription-operator", "transcription-system"
SA = f"system:serviceaccount:{SYSTEM_NS}:{RELEASE}"


def render(*sets: str) -> list[dict[str, Any]]:
    args = ["template", RELEASE, str(CHART), "-n", SYSTEM_NS]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


# --------------------------------------------------------------------------- offline


def test_helm_lint_is_clean() -> None:
    out = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out.stdout
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout


def test_default_render_is_cluster_wide_with_least_privilege() -> None:
    docs = render()
    assert {d["kind"] for d in docs} == {
        "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
        "Role", "RoleBinding", "PodDisruptionBudget",  # leader election, 2 replicas
    }  # fmt: skip
    rules = find(docs, "ClusterRole", RELEASE)[0]["rules"]
    resources = {r for rule in rules for r in rule["resources"]}
    assert "secrets" not in resources and "nodes" not in resources
    assert not any("*" in rule["verbs"] or "*" in rule["resources"] for rule in rules)
    # Pods are read (status says why they are not ready), never written.
    assert {v for rule in rules if "pods" in rule["resources"] for v in rule["verbs"]} == {
        "get",
        "list",
        "watch",
    }
    dep = find(docs, "Deployment")[0]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert {e["name"]: e.get("value") for e in c["env"]}[
        "FASTER_WHISPER_IMAGE"
    ] == "ghcr.io/transcription-dev/worker-cpu:0.1.0"
    crd = find(docs, "CustomResourceDefinition")[0]
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_default_render_runs_a_leader_and_a_hot_standby() -> None:
    docs = render()
    dep = find(docs, "Deployment")[0]
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert c["args"][2:] == [
        "--resync-period=5m",
        "--leader-elect=true",
        f"--leader-elect-resource-name={RELEASE}",
        "--leader-elect-lease-duration=15s",
        "--leader-elect-renew-deadline=10s",
        "--leader-elect-retry-period=2s",
    ]
    env = {e["name"]: e.get("valueFrom") for e in c["env"]}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    [term] = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        term["podAffinityTerm"]["labelSelector"]["matchLabels"]
        == dep["spec"]["selector"]["matchLabels"]
    )
    [pdb] = find(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": dep["spec"]["selector"]}
    # The Lease: in the release namespace only, and only the release's Lease beyond create.
    [role] = find(docs, "Role")
    [binding] = find(docs, "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == SYSTEM_NS
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": [RELEASE], "verbs": ["get", "update"]},
    ]  # fmt: skip
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": RELEASE, "namespace": SYSTEM_NS}
    ]


def test_without_leader_election_one_replica_recreated() -> None:
    docs = render("leaderElection.enabled=false", "replicas=1")
    dep = find(docs, "Deployment")[0]
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    assert dep["spec"]["replicas"] == 1
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-elect=false" in args and not [
        a for a in args if a.startswith("--leader-elect-")
    ]
    assert not find(docs, "Role") and not find(docs, "PodDisruptionBudget")
    assert "affinity" not in dep["spec"]["template"]["spec"]
    # A user's own affinity replaces the default anti-affinity.
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}}  # fmt: skip
    docs = render(*(f"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].{k}={v}"
                    for k, v in (("key", "pool"), ("operator", "In"), ("values[0]", "system"))))  # fmt: skip
    assert find(docs, "Deployment")[0]["spec"]["template"]["spec"]["affinity"] == own


def test_watch_namespaces_render_roles_only_there() -> None:
    docs = render("watchNamespaces={speech,asr}", "rbac.secretNames={api-keys}")
    # Nothing cluster-wide but reading CRDs (kopf discovers resources through them).
    [crds] = find(docs, "ClusterRole")
    assert crds["rules"] == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    roles = [
        r for r in find(docs, "Role") if not r["metadata"]["name"].endswith("-leader-election")
    ]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["asr", "speech"]
    secret_rule = [r for r in roles[0]["rules"] if r["resources"] == ["secrets"]]
    assert secret_rule == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["api-keys"],
            "verbs": ["get"],
        }
    ]
    args = find(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=speech" in args and "--namespace=asr" in args


def test_a_namespace_pattern_reads_every_namespace_and_passes_the_patterns_on() -> None:
    """A pattern (`team-*`, `!team-ci-*`) cannot be a Role's namespace: the operator must
    see every namespace to know which match, so the chart grants what watching every
    namespace does, and the operator keeps the ones the patterns admit."""
    docs = render("watchNamespaces={team-*,!team-ci-*}")
    wide = find(docs, "ClusterRole", RELEASE)
    assert wide and {"apiGroups": [""], "resources": ["namespaces"],
                     "verbs": ["get", "list", "watch"]} in wide[0]["rules"]  # fmt: skip
    assert not [
        r for r in find(docs, "Role") if not r["metadata"]["name"].endswith("-leader-election")
    ]
    args = find(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-*" in args and "--namespace=!team-ci-*" in args


@pytest.mark.parametrize("entry", ["Team-*", "team_a", "a b"])
def test_a_watch_namespace_that_is_neither_a_name_nor_a_pattern_is_refused(entry: str) -> None:
    out = helm(
        "template", RELEASE, str(CHART), "--set", f"watchNamespaces={{{entry}}}", check=False
    )
    assert out.returncode != 0 and "/watchNamespaces/0" in out.stderr
    assert (
        helm("template", RELEASE, str(CHART), "--set", "watchNamespaces={speech}").returncode == 0
    )


def test_the_admission_policy_only_warns_and_can_be_turned_off() -> None:
    from transcription_api.findings import POLICY_NAME

    docs = render()
    [vap] = find(docs, "ValidatingAdmissionPolicy")
    [binding] = find(docs, "ValidatingAdmissionPolicyBinding")
    assert vap["metadata"]["name"] == binding["spec"]["policyName"] == POLICY_NAME
    assert binding["spec"]["validationActions"] == ["Warn"]
    assert vap["metadata"]["labels"]["helm.sh/chart"].startswith("transcription-operator-")
    docs = render("admissionPolicy.enabled=false")
    assert not find(docs, "ValidatingAdmissionPolicy") and not find(
        docs, "ValidatingAdmissionPolicyBinding"
    )


def test_optional_service_monitor_and_dashboard() -> None:
    """The ServiceMonitor only where prometheus-operator's CRD is served (tests/
    test_monitoring.py covers the monitors, the rules and the dashboard's queries)."""
    assert not find(render("metrics.serviceMonitor.enabled=true"), "ServiceMonitor")
    args = ["template", RELEASE, str(CHART), "-n", SYSTEM_NS, "--api-versions",
            "monitoring.coreos.com/v1/ServiceMonitor", "--set", "metrics.serviceMonitor.enabled=true",
            "--set", "dashboard.enabled=true"]  # fmt: skip
    docs = [d for d in yaml.safe_load_all(helm(*args).stdout) if d]
    (endpoint,) = find(docs, "ServiceMonitor")[0]["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["interval"]) == ("metrics", "30s")
    dashboard = json.loads(find(docs, "ConfigMap")[0]["data"]["transcription.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    for metric in (
        "transcription_frontend_requests_total",
        "vllm:num_requests_running",
        "transcription_operator_reconciles_total",
    ):
        assert metric in exprs


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("replicas=2,leaderElection.enabled=false", "replicas"),  # two active controllers
        ("leaderElection.leaseDuration=15", "leaseDuration"),  # a Go duration: 15s
        ("leaderElection.bogus=1", "bogus"),
        ("bogus=1", "bogus"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("resyncPeriod=often", "resyncPeriod"),  # a Go duration: 5m
    ],
)
def test_values_schema_rejects_bad_values(value: str, message: str) -> None:
    out = helm("template", RELEASE, str(CHART), "--set", value, check=False)
    assert out.returncode != 0 and message in out.stderr


def test_install_yaml_is_in_sync_with_the_chart() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "charts.render_install", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr


# --------------------------------------------------------------------------- on the test bed


@pytest.fixture(scope="module")
def chart(kubectl: Kubectl, cluster: Path) -> Iterator[None]:
    # The operator's pod is simulated here (the tests below run the operator as a local
    # process with the chart's token); test_realnode.py runs the chart's image for real.
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": SYSTEM_NS, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})  # fmt: skip
    # Annotated, not applied: `kubectl apply -f install.yaml` (its Namespace has none) would
    # remove applied annotations, and its pods would then wait for a node that never comes.
    kubectl("annotate", "--overwrite", "namespace", SYSTEM_NS,
            *(f"{k}={v}" for k, v in testbed.cluster.SIMULATED_NAMESPACE_ANNOTATIONS.items()))  # fmt: skip
    # A CRD applied earlier with kubectl (the operator fixture does) is adopted by the
    # release, as Helm documents: its ownership label and annotations.
    # Both CRDs: a module run before this one may have applied them (Helm refuses to take
    # over one without these).
    for crd in (f"crd/{f.stem}" for f in (CRD_FILE, GATEWAY_CRD_FILE)):
        if kubectl.run("get", crd, check=False).returncode == 0:
            kubectl("label", "--overwrite", crd, "app.kubernetes.io/managed-by=Helm")
            kubectl("annotate", "--overwrite", crd, f"meta.helm.sh/release-name={RELEASE}",
                    f"meta.helm.sh/release-namespace={SYSTEM_NS}")  # fmt: skip
    helm(
        "upgrade",
        "--install",
        RELEASE,
        str(CHART),
        "-n",
        SYSTEM_NS,
        "--wait",
        "--timeout",
        "2m",
        kubeconfig=cluster,
    )
    yield
    helm("uninstall", RELEASE, "-n", SYSTEM_NS, check=False, kubeconfig=cluster)


def sa_kubeconfig(kubectl: Kubectl, path: Path) -> Path:
    """A kubeconfig that authenticates as the chart's ServiceAccount (a bound token)."""
    token = kubectl("create", "token", RELEASE, "-n", SYSTEM_NS, "--duration=2h").strip()
    admin = yaml.safe_load(kubectl.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
    }))  # fmt: skip
    return path


def test_helm_install_and_upgrade(kubectl: Kubectl, chart: None, cluster: Path) -> None:
    dep = kubectl.json("get", "deployment", RELEASE, "-n", SYSTEM_NS)
    assert dep["status"].get("readyReplicas") == 2  # admitted under restricted PodSecurity
    out = helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        SYSTEM_NS,
        "--reuse-values",
        "--set",
        "logLevel=DEBUG",
        "--wait",
        kubeconfig=cluster,
    )
    assert "has been upgraded" in out.stdout
    env = kubectl.json("get", "deployment", RELEASE, "-n", SYSTEM_NS)["spec"]["template"]["spec"][
        "containers"
    ][0]["env"]
    assert {"name": "LOG_LEVEL", "value": "DEBUG"} in env
    assert (
        "TranscriptionDeployment"
        in helm("get", "notes", RELEASE, "-n", SYSTEM_NS, kubeconfig=cluster).stdout
    )


def can_i(kubectl: Kubectl, *args: str) -> bool:
    out = kubectl.run("auth", "can-i", *args, "--as", SA, check=False)
    return out.stdout.strip() == "yes"


def test_cluster_wide_rbac_denies_what_it_was_not_given(kubectl: Kubectl, chart: None) -> None:
    assert can_i(kubectl, "patch", "deployments", "-n", "anywhere")
    assert can_i(
        kubectl, "patch", "transcriptiondeployments", "--subresource=status", "-n", "anywhere"
    )
    assert not can_i(kubectl, "get", "secrets", "-n", "default")
    assert not can_i(kubectl, "list", "secrets", "-A")
    assert not can_i(kubectl, "get", "nodes")
    assert not can_i(kubectl, "create", "pods", "-n", "default")
    assert not can_i(kubectl, "delete", "pods", "-n", "default")
    assert can_i(kubectl, "watch", "pods", "-n", "anywhere")  # status reads them
    assert can_i(kubectl, "watch", "events", "-n", "anywhere")
    assert not can_i(kubectl, "delete", "events", "-n", "anywhere")
    assert not can_i(kubectl, "delete", "namespaces")
    # Gateways: their status, and namespaces' labels (from: Selector), read-only.
    assert can_i(
        kubectl, "patch", "transcriptiongateways", "--subresource=status", "-n", "anywhere"
    )
    assert can_i(kubectl, "watch", "namespaces")
    assert not can_i(kubectl, "patch", "namespaces")
    assert not can_i(kubectl, "create", "clusterroles")
    # Leader election: its own Lease, in its own namespace; nobody else's.
    assert can_i(kubectl, "create", "leases", "-n", SYSTEM_NS)
    assert can_i(kubectl, "update", f"leases/{RELEASE}", "-n", SYSTEM_NS)
    assert not can_i(kubectl, "update", "leases/kube-scheduler", "-n", "kube-system")
    assert not can_i(kubectl, "update", "leases/other", "-n", SYSTEM_NS)
    assert not can_i(kubectl, "delete", f"leases/{RELEASE}", "-n", SYSTEM_NS)
    assert not can_i(kubectl, "create", "leases", "-n", "default")


def test_namespaced_rbac_stays_in_its_namespaces(
    kubectl: Kubectl, chart: None, cluster: Path, namespace: str
) -> None:
    helm("upgrade", RELEASE, str(CHART), "-n", SYSTEM_NS, "--reuse-values", "--wait",
         "--set", f"watchNamespaces={{{namespace}}}", "--set", "rbac.secretNames={api-keys}", kubeconfig=cluster)  # fmt: skip
    try:
        assert can_i(kubectl, "patch", "deployments", "-n", namespace)
        assert not can_i(kubectl, "patch", "deployments", "-n", "default")
        assert not can_i(kubectl, "list", "transcriptiondeployments", "-A")
        assert can_i(kubectl, "watch", "transcriptiongateways", "-n", namespace)
        assert not can_i(kubectl, "list", "namespaces")  # namespaced: never reads them
        assert can_i(kubectl, "get", "secrets/api-keys", "-n", namespace)
        assert not can_i(kubectl, "get", "secrets/other", "-n", namespace)
        assert not can_i(kubectl, "list", "secrets", "-n", namespace)
    finally:
        helm(
            "upgrade",
            RELEASE,
            str(CHART),
            "-n",
            SYSTEM_NS,
            "--reset-values",
            "--wait",
            kubeconfig=cluster,
        )


def test_operator_with_the_charts_permissions_reconciles_to_ready_under_restricted_psa(
    kubectl: Kubectl, chart: None, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    operator.stop()  # the admin-credentialed one
    # With leader election as the chart runs it: the chart's pods are simulated here and
    # never take the Lease, so this process does, with the chart's Role.
    election = ["--leader-elect", f"--leader-elect-resource-namespace={SYSTEM_NS}",
                f"--leader-elect-resource-name={RELEASE}"]  # fmt: skip
    scoped = OperatorProcess(
        sa_kubeconfig(kubectl, tmp_path / "sa.kubeconfig"), tmp_path / "sa-operator.log", election
    )
    scoped.start()
    try:
        kubectl.apply(SAMPLES["auto-split"], namespace)
        td = wait_ready(kubectl, namespace, "whisper-split")
        assert td["status"]["readyPools"] == "2/2"
        # Every pod was admitted by PodSecurity "restricted" (the API server decided).
        pods = kubectl.json("get", "pods", "-n", namespace)["items"]
        assert len(pods) == 5 and all(p["status"]["phase"] == "Running" for p in pods)
        events = kubectl.json("get", "events", "-n", namespace)["items"]
        assert not [e for e in events if e["reason"] == "FailedCreate"]
        log = (tmp_path / "sa-operator.log").read_text()
        assert "forbidden" not in log.lower()  # every API 403 says "... is forbidden: ..."
        lease = kubectl.json("get", "lease", RELEASE, "-n", SYSTEM_NS)
        assert lease["spec"]["holderIdentity"] in log  # "became the leader: ... held by <id>"
    finally:
        scoped.stop()
        operator.start()


def test_restricted_psa_is_enforced(kubectl: Kubectl, namespace: str) -> None:
    """Control: the same namespace label refuses a pod that is not restricted-compatible."""
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    out = kubectl.run("apply", "-n", namespace, "-f", "-", input=json.dumps(pod), check=False)
    assert out.returncode != 0 and 'violates PodSecurity "restricted:latest"' in out.stderr


def test_kubectl_install_path_for_real(
    kubectl: Kubectl, chart: None, cluster: Path, operator: OperatorProcess, namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """`kubectl apply -f install.yaml`, not a dry run, on a cluster without the release: the
    operator it installs comes up, and an operator holding exactly its ServiceAccount's
    permissions reconciles a sample to Ready. (Last in this module: it replaces the release.)"""
    install = ROOT / "install.yaml"
    docs = [d for d in yaml.safe_load_all(install.read_text()) if d]
    helm("uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", kubeconfig=cluster)  # the CRD stays
    assert kubectl.run("get", "clusterrole", RELEASE, check=False).returncode != 0
    try:
        out = kubectl("apply", "-f", str(install))
        assert len(out.strip().splitlines()) == len(docs), out  # one line per object
        assert all(
            ln.endswith((" created", " configured", " unchanged")) for ln in out.splitlines()
        )
        kubectl("wait", "--for=condition=Available", f"deployment/{RELEASE}", "-n", SYSTEM_NS,
                "--timeout=120s")  # fmt: skip
        assert can_i(kubectl, "patch", "networkpolicies", "-n", namespace)
        assert not can_i(kubectl, "get", "secrets", "-n", namespace)
        operator.stop()  # the admin-credentialed one
        scoped = OperatorProcess(sa_kubeconfig(kubectl, tmp_path / "sa.kubeconfig"),
                                 tmp_path / "install-yaml-operator.log")  # fmt: skip
        try:
            scoped.start()  # inside: an operator that cannot start is stopped all the same
            kubectl.apply(SAMPLES["cpu-faster-whisper"], namespace)
            wait_ready(kubectl, namespace, "whisper-cpu")
            # No RBAC denial ("... is forbidden: User "system:serviceaccount:..." cannot ...");
            # other suites' namespaces being deleted may refuse writes in their own words.
            log = (tmp_path / "install-yaml-operator.log").read_text()
            assert f'forbidden: User "{SA}" cannot' not in log
        finally:
            scoped.stop()
            operator.start()
    finally:
        # Remove what install.yaml made, except the CRD (other suites' resources use it).
        for d in reversed(docs):
            if d["kind"] not in ("CustomResourceDefinition", "Namespace"):
                kubectl.run("delete", d["kind"], d["metadata"]["name"], "--ignore-not-found",
                            *(["-n", d["metadata"]["namespace"]] if d["metadata"].get("namespace") else []),
                            check=False)  # fmt: skip
