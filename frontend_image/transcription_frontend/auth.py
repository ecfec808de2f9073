"""API keys: the accepted keys (a mounted Secret), re-read when it changes; fail closed.

The key file (UTF-8, a leading BOM is ignored), one key per line:

    # team A: every model
    sk-team-a
    # team B: only these models (names or aliases, separated by spaces or commas)
    sk-team-b whisper-1
    # a key of tenant `drafts` (spec.frontend.tenants): its quota, priority and weight
    sk-team-c whisper-1 group=drafts

Blank lines and lines starting with `#` are ignored. A key belongs to at most one tenant
(`group=`, anywhere after the key); one naming a tenant that is not declared is refused
with 403 (tenants.py). Keys are compared as bytes, in constant time, with every accepted
key. A request (or WebSocket upgrade) with more than one `Authorization` header is refused
with 401 `duplicate_authorization`, keys or not: which of them counts would be a guess, and
two readers could guess differently. A key file that is configured but missing,
unreadable or without a key never opens the gateway: it is not ready (`/ready` answers
503 with the reason, logged once), and requests that need a key get 503 until the file
has keys. Once keys were read, a failed re-read (the Secret being swapped) keeps them.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from transcription_api.errors import APIError

log = logging.getLogger("transcription_frontend.auth")

BOM = "\ufeff"


GROUP = "group="


@dataclass(frozen=True)
class Key:
    secret: bytes
    models: frozenset[str] | None  # None: every model
    group: str | None = None  # its tenant's name (`group=`); several: joined by commas

    @functools.cached_property
    def label(self) -> str:
        """How metrics name the key without giving it away: its SHA-256's first 8 hex digits."""
        return hashlib.sha256(self.secret).hexdigest()[:8]

    def refusal(self, model: str, names_of: dict[str, str]) -> APIError | None:
        if allows(self.models, model, names_of):
            return None
        return model_not_allowed(f"This API key may not use the model `{model}`.")


def parse_keys(text: str) -> list[Key]:
    """The keys of a key file's text (format: the module's docstring)."""
    keys = []
    for line in text.removeprefix(BOM).splitlines():
        line = line.strip().removeprefix(BOM)
        if not line or line.startswith("#"):
            continue
        secret, *words = re.split(r"[\s,]+", line)
        groups = [w.removeprefix(GROUP) for w in words if w.startswith(GROUP)]
        models = [w for w in words if not w.startswith(GROUP)]
        keys.append(Key(secret.encode("utf-8"), frozenset(models) if models else None,
                        ",".join(groups) if groups else None))  # fmt: skip
    return keys


def authorization(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The request's `Authorization` header (ASGI's raw headers; None: it has none), as
    latin-1 text; 401 if it has several (HTTP and the realtime WebSocket alike)."""
    values = [v for k, v in headers if k.lower() == b"authorization"]
    if len(values) > 1:
        raise APIError(
            401,
            f"The request has {len(values)} `Authorization` headers; send exactly one: "
            "`Authorization: Bearer <key>`.",
            code="duplicate_authorization",
        )
    return values[0].decode("latin-1") if values else None


class ApiKeys:
    def __init__(
        self, path: Path | None, on_problem: Callable[[str], None] = lambda problem: None,
        on_read: Callable[[list[Key]], None] = lambda keys: None,
    ) -> None:  # fmt: skip
        self.path = path
        self.on_problem = on_problem  # told once per new problem (events.py)
        self.on_read = on_read  # told the keys of each new read (tenants.py checks groups)
        self._mtime: float | None = None
        self._keys: list[Key] = []
        self.problem: str | None = None  # why no key can be checked now; None: fine
        if path is not None:
            self.keys()

    def keys(self) -> list[Key]:
        """Accepted keys; none when no file is configured (the gateway is open)."""
        if self.path is None:
            return []
        try:
            mtime = self.path.stat().st_mtime
            if mtime == self._mtime:
                return self._keys
            keys = parse_keys(self.path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            if self._keys:  # the Secret is being swapped: keep the last keys
                return self._keys
            self._fail(f"the API key file {self.path} cannot be read ({e})")
            return []
        self._mtime = mtime
        if not keys:
            self._keys = []
            self._fail(f"the API key file {self.path} has no key")
            return []
        if self.problem is not None or not self._keys:
            log.info("API keys: %d read from %s", len(keys), self.path)
        self._keys, self.problem = keys, None
        self.on_read(keys)
        return keys

    def _fail(self, problem: str) -> None:
        if problem != self.problem:
            log.error("%s: not ready, and no request is served until it has keys", problem)
            self.on_problem(f"{problem}: the gateway is not ready and serves no request until "
                            "it has a key")  # fmt: skip
        self.problem = problem

    def check(self, authorization: str | None) -> Key | None:
        """The key `Authorization: Bearer <key>` names (None when keys are off); 401 if it
        names none, 503 if a key file is configured and has no key."""
        if self.path is None:
            return None
        keys = self.keys()
        if not keys:
            raise APIError(
                503,
                "The gateway's API keys are not available; try again later.",
                code="api_keys_unavailable",
                headers={"Retry-After": "5"},
            )
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise APIError(401, "Missing API key: send `Authorization: Bearer <key>`.")
        # Header values arrive as latin-1 text: back to the bytes the client sent.
        sent = token.strip().encode("latin-1", "replace")
        found = None
        for k in keys:  # every key compared, so the time says nothing about which matched
            if hmac.compare_digest(sent, k.secret):
                found = k
        if found is None:
            raise APIError(401, "Incorrect API key provided.")
        return found


class Scope(Protocol):
    """Who may use which models: a key (`Key`), or a key with its tenant (tenants.Caller)."""

    def refusal(self, model: str, names_of: dict[str, str]) -> APIError | None:
        """None if it may use `model` (a primary name; `names_of` maps every served name and
        alias to its primary), else the 403 that says why not."""
        ...


def allows(models: Collection[str] | None, model: str, names_of: dict[str, str]) -> bool:
    """Whether a scope of these names and aliases (None: every model) holds `model` (a
    primary name); `names_of` maps every served name and alias to its primary."""
    return models is None or any(names_of.get(m, m) == model for m in models)


def may_use(scope: Scope | None, model: str, names_of: dict[str, str]) -> bool:
    """Whether `scope` (None: no keys) may use `model`, a primary name."""
    return scope is None or scope.refusal(model, names_of) is None


def check_scope(scope: Scope | None, model: str, names_of: dict[str, str]) -> None:
    """403 unless `scope` may use `model` (`may_use`)."""
    error = None if scope is None else scope.refusal(model, names_of)
    if error is not None:
        raise error


def model_not_allowed(message: str) -> APIError:
    return APIError(403, message, param="model", code="model_not_allowed")
