"""Tenants: groups of API keys that share a scope of models, a quota (quota.py) and a share
of busy pools (hold.py, fair.py), declared in the frontend's settings
(`spec.frontend.tenants`).

A key joins a tenant with `group=<name>` in the key file (auth.py). Keys without a group,
and every request when there is no key file, are tenant `default`: the declared one, else
one without limits (interactive, weight 1). The tenant, never the key, is the unit of
quota and fairness: several keys of one team share them; and metrics name tenants, never
keys.

A key whose group names no declared tenant fails closed for that key only: its requests
get 403 naming the tenant (the key is genuine, so not 401, which would send its owner to
look for a typo in the key; but the gateway has no settings for it, and serving it
unlimited would fail open), while every other key keeps working. Each read of the key file
that finds such keys says so in the log and in a Warning Event about the pod
(`APIKeyUnknownTenant`), as the key file's other problems do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from transcription_api.errors import APIError
from transcription_api.frontend import DEFAULT_TENANT, Priority, TenantSpec

from .auth import Key, allows, model_not_allowed
from .fair import Flow

log = logging.getLogger("transcription_frontend.tenants")


@dataclass(frozen=True)
class Caller:
    """Who sends a request: its key (None without keys) and its tenant."""

    key: Key | None
    tenant: TenantSpec

    def refusal(self, model: str, names_of: dict[str, str]) -> APIError | None:
        """None if both the key and the tenant may use `model` (a primary name), else the 403
        naming which may not (auth.Scope)."""
        if self.key is not None and (error := self.key.refusal(model, names_of)):
            return error
        if allows(self.tenant.models, model, names_of):
            return None
        models = ", ".join(self.tenant.models or [])
        return model_not_allowed(
            f"Tenant `{self.tenant.name}` (this API key's group) may not use the model "
            f"`{model}`; its models: {models}."
        )

    def flow(self, interactive: bool = False) -> Flow:
        """How its requests wait for a busy pool; `interactive`: whatever its tenant's class
        (a realtime turn: someone is listening)."""
        batch = self.tenant.priority == Priority.BATCH and not interactive
        return Flow(self.tenant.name, self.tenant.weight, batch)


class Tenants:
    """The declared tenants, and who of them a key is."""

    def __init__(
        self, specs: list[TenantSpec], on_problem: Callable[[str], None] = lambda problem: None
    ) -> None:
        self.specs = {t.name: t for t in specs}
        self.default = self.specs.get(DEFAULT_TENANT) or TenantSpec(name=DEFAULT_TENANT)
        self.on_problem = on_problem  # told of each key file with unknown groups (events.py)
        self._problem: str | None = None

    def caller(self, key: Key | None) -> Caller:
        """`key`'s caller: its tenant, `default` without a group; 403 for a group that
        names no tenant."""
        if key is None or key.group is None:
            return Caller(key, self.default)
        tenant = self.specs.get(key.group)
        if tenant is None:
            raise APIError(
                403,
                f"This API key belongs to tenant `{key.group}`, which this gateway does not "
                f"declare (its tenants: {self._declared()}). Ask its operators to add it to "
                "spec.frontend.tenants, or to fix the key's `group=` in the key file.",
                code="unknown_tenant",
            )
        return Caller(key, tenant)

    def keys_read(self, keys: list[Key]) -> None:
        """A new key file was read: say which of its keys name no tenant (by label)."""
        unknown = [k for k in keys if k.group is not None and k.group not in self.specs]
        if not unknown:
            self._problem = None
            return
        named = ", ".join(f"{k.label} (group={k.group})" for k in unknown)
        problem = (
            f"API keys {named} name tenants this gateway does not declare (its tenants: "
            f"{self._declared()}): their requests get 403 until the tenant is declared in "
            "spec.frontend.tenants or the key file is fixed"
        )
        if problem != self._problem:
            log.warning("%s", problem)
            self.on_problem(problem)
        self._problem = problem

    def _declared(self) -> str:
        return ", ".join(self.specs) or "none"
