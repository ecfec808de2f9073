"""Flux's controllers built with what the test bed's GitOps test uses, without the cloud SDKs.

source-controller registers five reconcilers in one ``main.go`` (GitRepository, and the
HelmRepository, HelmChart, Bucket and OCIRepository ones, which link Helm, cosign, notation,
MinIO and the AWS, Azure and GCP storage and registry clients); kustomize-controller's SOPS
decryptor links AWS, Azure and GCP KMS and Vault; and both reach the cloud SDKs again
through ``github.com/fluxcd/pkg/auth``, whose ``utils`` package looks its providers up by
name (AWS, Azure, GCP, generic) for a GitRepository's ``spec.provider`` or a Kustomization's
``spec.kubeConfig.configMapRef``. The test bed's GitOps test (e2e/test_gitops_flux.py) uses
a GitRepository over plain HTTP without credentials and a Kustomization without decryption.

This build keeps those, and whatever it leaves out fails with an error that says so:

- source-controller registers the GitRepository reconciler only (it logs at start which
  kinds it leaves out: objects of those kinds are not reconciled), and a GitRepository
  whose ``spec.provider`` is not ``generic`` stalls (``InvalidProviderConfiguration``) with
  "spec.provider '...' is left out of the test bed's build of source-controller";
- kustomize-controller's decryptor is a stand-in: a Kustomization with ``spec.decryption``
  fails to build with "spec.decryption (SOPS) is left out of the test bed's build of
  kustomize-controller" (a SOPS-encrypted Secret without it is refused as before);
- ``fluxcd/pkg/auth`` looks up the ``generic`` provider only: "provider 'aws' is left out
  of the test bed's build of Flux".

A cluster's own Flux, installed from its release, is not affected: this is the test bed's
copy. Each module's source is copied, edited there (each edit matched by an exact snippet
of the pinned version's source: a new version that no longer has one stops the build,
naming the file) and built against the copy (a ``replace`` per module in a copy of the
wrapper's go.mod): 1,328 packages for the two controllers instead of 2,576 (`go list -deps`,
the standard library's included; source-controller 1,248 instead of 2,370,
kustomize-controller 1,128 instead of 1,901), and no module of AWS, Azure, GCP, Helm,
sigstore or SOPS among them. Built cold (empty build cache, filled module cache) on 2 cores:
116 s and 222 CPU-s instead of 217 s and 412 CPU-s; 48 + 51 MiB instead of 99 + 83 MiB.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

SOURCE = "github.com/fluxcd/source-controller"
KUSTOMIZE = "github.com/fluxcd/kustomize-controller"
AUTH = "github.com/fluxcd/pkg/auth"
UPDATE = "update toolchain/flux.py for the pinned Flux version"


@dataclass(frozen=True)
class Edit:
    """One change to one file of a module's source: `old`, found exactly once, becomes `new`;
    with `until`, the text from `old` up to `until` (found once after it, and kept) does; with
    `to_end`, the text from `old` to the end of the file does."""

    path: str  # relative to the module's root
    old: str
    new: str = ""
    until: str | None = None
    to_end: bool = False


@dataclass(frozen=True)
class Plan:
    """What the trimmed copy of one module leaves out."""

    module: str
    edits: tuple[Edit, ...] = ()
    removed: tuple[str, ...] = ()  # files deleted from the copy
    # Snippets the edited code stands in for (signatures it keeps), checked before any edit:
    # (path, snippet).
    needs: tuple[tuple[str, str], ...] = ()


def _shown(snippet: str) -> str:
    """A snippet's first line, for a message."""
    line = snippet.strip().splitlines()[0] if snippet.strip() else snippet
    return repr(line if len(line) <= 80 else line[:77] + "...")


def edit(text: str, e: Edit, where: str) -> str:
    """`text` (the file `where` names) with the edit `e` made."""
    if text.count(e.old) != 1:
        raise SystemExit(
            f"{where} has {text.count(e.old) or 'no'} {_shown(e.old)} where one was expected: "
            f"{UPDATE}"
        )
    begin = text.index(e.old)
    if e.to_end:
        return text[:begin] + e.new
    if e.until is None:
        return text[:begin] + e.new + text[begin + len(e.old) :]
    rest = text[begin + len(e.old) :]
    if rest.count(e.until) != 1:
        raise SystemExit(
            f"{where} has {rest.count(e.until) or 'no'} {_shown(e.until)} after {_shown(e.old)} "
            f"where one was expected: {UPDATE}"
        )
    return text[:begin] + e.new + rest[rest.index(e.until) :]


def apply(plan: Plan, src: Path) -> None:
    """Trim a writable copy of `plan.module`'s source in place; nothing is changed when any
    of its files or snippets is missing."""
    texts: dict[str, str] = {}

    def read(path: str) -> str:
        if path not in texts:
            if not (src / path).is_file():
                raise SystemExit(f"{plan.module} has no {path}: {UPDATE}")
            texts[path] = (src / path).read_text()
        return texts[path]

    for path in plan.removed:
        read(path)
    for path, snippet in plan.needs:
        if snippet not in read(path):
            raise SystemExit(f"{plan.module}'s {path} has no {_shown(snippet)}: {UPDATE}")
    for e in plan.edits:
        texts[e.path] = edit(read(e.path), e, f"{plan.module}'s {e.path}")
    for path in plan.removed:
        (src / path).unlink()
        del texts[path]
    for path, text in texts.items():
        (src / path).write_text(text)


def recipe(plan: Plan) -> str:
    """What the trimmed module depends on, for the tool's cache entry."""
    return f"trim={hashlib.sha256(repr(plan).encode()).hexdigest()[:12]}"


# ---------------------------------------------------------------------- source-controller

LEFT_OUT = ("HelmRepository", "HelmChart", "Bucket", "OCIRepository")
MAIN = "main.go"
GIT = "internal/controller/gitrepository_controller.go"
SOURCE_PLAN = Plan(
    SOURCE,
    removed=tuple(f"internal/controller/{k.lower()}_controller.go" for k in LEFT_OUT),
    edits=(
        # The other reconcilers and what main.go sets up for them only: Helm's getters,
        # limits and index cache, cosign's verifier.
        Edit(MAIN, '\t"helm.sh/helm/v4/pkg/getter"\n'),
        Edit(MAIN, '\t"github.com/fluxcd/source-controller/internal/cache"\n'),
        Edit(
            MAIN,
            '\t"github.com/fluxcd/source-controller/internal/helm"\n'
            '\tscosign "github.com/fluxcd/source-controller/internal/oci/cosign"\n',
        ),
        Edit(MAIN, "\tgetters ", until=")\n\nfunc init() {"),
        Edit(MAIN, "\t\thelmIndexLimit ", until="\t\tartifactOptions "),
        Edit(MAIN, "\t\thelmCacheMaxSize ", until="\t\ttokenCacheOptions "),
        Edit(
            MAIN,
            "\tflag.Int64Var(&helmIndexLimit, ",
            until="\tflag.DurationVar(&requeueDependency, ",
        ),
        Edit(
            MAIN, "\tflag.IntVar(&helmCacheMaxSize, ", until="\tflag.StringSliceVar(&git.KexAlgos, "
        ),
        Edit(MAIN, "\tCosignVerifierFactory := scosign.NewCosignVerifierFactory()\n\n"),
        Edit(MAIN, "\tcacheRecorder := cache.MustMakeMetrics()\n"),
        Edit(
            MAIN,
            "\tmustSetupHelmLimits(helmIndexLimit, helmChartLimit, helmChartFileLimit)\n"
            "\thelmIndexCache, helmIndexCacheItemTTL := mustInitHelmCache(",
            until="\tvar tokenCache *pkgcache.TokenCache\n",
        ),
        Edit(
            MAIN,
            "\tif err := (&controller.HelmRepositoryReconciler{\n",
            "\tsetupLog.Info(\"the test bed's build of source-controller (toolchain/flux.py) "
            f'reconciles GitRepository only: it leaves out {", ".join(LEFT_OUT)}")\n',
            until="\t// +kubebuilder:scaffold:builder\n",
        ),
        Edit(MAIN, "func mustSetupHelmLimits(", until="func envOrDefault("),
        # A GitRepository's provider authentication (Azure, AWS, GitHub App): refused.
        Edit(
            GIT,
            '\t"github.com/fluxcd/pkg/auth/githubapp"\n'
            '\tauthutils "github.com/fluxcd/pkg/auth/utils"\n',
        ),
        Edit(
            GIT,
            "\tswitch provider := obj.GetProvider(); provider {\n",
            "\tif provider := obj.GetProvider(); provider != sourcev1.GitProviderGeneric {\n"
            "\t\te := serror.NewStalling(\n"
            "\t\t\tfmt.Errorf(\"spec.provider '%s' is left out of the test bed's build of "
            "source-controller (toolchain/flux.py): only 'generic' is built in\", provider),\n"
            "\t\t\tsourcev1.InvalidProviderConfigurationReason,\n"
            "\t\t)\n"
            '\t\tconditions.MarkTrue(obj, sourcev1.FetchFailedCondition, e.Reason, "%s", e)\n'
            "\t\treturn nil, e\n"
            "\t}\n",
            until="\tif getCreds != nil {\n",
        ),
    ),
)

# -------------------------------------------------------------------- kustomize-controller

DECRYPTOR = "internal/decryptor/decryptor.go"
# What the stand-in decryptor replaces Flux's imports, Decryptor and New with: options.go
# (kept) sets these fields.
DECRYPTOR_HEAD = """\
// The test bed's build of kustomize-controller (toolchain/flux.py) leaves out SOPS
// decryption, whose key services link the AWS, Azure and GCP SDKs and Vault's: this
// Decryptor builds a Kustomization without spec.decryption as Flux's does (there is
// nothing to decrypt) and refuses one with it.

import (
\t"context"
\t"errors"
\t"fmt"
\t"strings"

\t"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
\t"k8s.io/apimachinery/pkg/types"
\t"sigs.k8s.io/controller-runtime/pkg/client"
\t"sigs.k8s.io/kustomize/api/resource"

\t"github.com/fluxcd/pkg/cache"

\tkustomizev1 "github.com/fluxcd/kustomize-controller/api/v1"
)

// Decryptor holds what the options set; it decrypts nothing.
type Decryptor struct {
\troot           string
\ttokenCache     *cache.TokenCache
\tsopsAgeSecret  *types.NamespacedName
\tvaultConfigMap *types.NamespacedName
}

// New refuses a Kustomization with spec.decryption.
func New(client client.Client, kustomization *kustomizev1.Kustomization, opts ...Option) (*Decryptor, func(), error) {
\tif kustomization.Spec.Decryption != nil {
\t\treturn nil, nil, errors.New("spec.decryption (SOPS) is left out of the test bed's build of kustomize-controller (toolchain/flux.py)")
\t}
\td := &Decryptor{}
\tfor _, opt := range opts {
\t\topt(d)
\t}
\treturn d, func() {}, nil
}

"""
# ... Flux's IsDecryptionDisabled and IsEncryptedSecret stay, and the rest becomes:
DECRYPTOR_TAIL = """\
// ImportKeys, SetAuthOptions, DecryptSources and DecryptResource do what Flux's do for a
// Kustomization without spec.decryption (New refused any other): nothing.

func (d *Decryptor) ImportKeys(ctx context.Context) error { return nil }

func (d *Decryptor) SetAuthOptions(ctx context.Context) {}

func (d *Decryptor) DecryptSources(path string) error { return nil }

func (d *Decryptor) DecryptResource(res *resource.Resource) (*resource.Resource, error) {
\treturn nil, nil
}
"""
KUSTOMIZE_PLAN = Plan(
    KUSTOMIZE,
    needs=tuple(
        (DECRYPTOR, signature)
        for signature in (
            "func New(client client.Client, kustomization *kustomizev1.Kustomization, "
            "opts ...Option) (*Decryptor, func(), error) {\n",
            "func IsDecryptionDisabled(annotations map[string]string) bool {\n",
            "func IsEncryptedSecret(object *unstructured.Unstructured) bool {\n",
            "func (d *Decryptor) ImportKeys(ctx context.Context) error {\n",
            "func (d *Decryptor) SetAuthOptions(ctx context.Context) {\n",
            "func (d *Decryptor) DecryptSources(path string) error {\n",
            "func (d *Decryptor) DecryptResource(res *resource.Resource) "
            "(*resource.Resource, error) {\n",
        )
    ),
    edits=(
        Edit(
            DECRYPTOR, "\nimport (\n", "\n" + DECRYPTOR_HEAD, until="// IsDecryptionDisabled checks"
        ),
        Edit(
            DECRYPTOR,
            "// ImportKeys imports the DecryptionProviderSOPS keys",
            DECRYPTOR_TAIL,
            to_end=True,
        ),
    ),
)

# ------------------------------------------------------------------------ fluxcd/pkg/auth

PROVIDERS = "utils/provider.go"
AUTH_PLAN = Plan(
    AUTH,
    edits=(
        Edit(
            PROVIDERS,
            '\t"github.com/fluxcd/pkg/auth/aws"\n'
            '\t"github.com/fluxcd/pkg/auth/azure"\n'
            '\t"github.com/fluxcd/pkg/auth/gcp"\n',
        ),
        Edit(
            PROVIDERS,
            "\tcase aws.ProviderName:\n\t\tp = aws.Provider{}\n"
            "\tcase azure.ProviderName:\n\t\tp = azure.Provider{}\n"
            "\tcase gcp.ProviderName:\n\t\tp = gcp.Provider{}\n",
            '\tcase "aws", "azure", "gcp":\n'
            "\t\treturn zero, fmt.Errorf(\"provider '%s' is left out of the test bed's build of "
            "Flux (toolchain/flux.py): only 'generic' is built in\", name)\n",
        ),
    ),
)

PLANS = (SOURCE_PLAN, KUSTOMIZE_PLAN, AUTH_PLAN)
