"""API keys: the accepted keys (a mounted Secret), re-read when it changes; fail closed.

The key file (UTF-8, a leading BOM is ignored), one key per line:

    # team A: every model
    sk-team-a
    # team B: only these models (names or aliases, separated by spaces or commas)
    sk-team-b whisper-1

Blank lines and lines starting with `#` are ignored. Keys are compared as bytes, in
constant time, with every accepted key. A key file that is configured but missing,
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transcription_api.errors import APIError

log = logging.getLogger("transcription_frontend.auth")

BOM = "\ufeff"


@dataclass(frozen=True)
class Key:
    secret: bytes
    models: frozenset[str] | None  # None: every model

    @functools.cached_property
    def label(self) -> str:
        """How metrics name the key without giving it away: its SHA-256's first 8 hex digits."""
        return hashlib.sha256(self.secret).hexdigest()[:8]


def parse_keys(text: str) -> list[Key]:
    """The keys of a key file's text (format: the module's docstring)."""
    keys = []
    for line in text.removeprefix(BOM).splitlines():
        line = line.strip().removeprefix(BOM)
        if not line or line.startswith("#"):
            continue
        secret, *models = re.split(r"[\s,]+", line)
        keys.append(Key(secret.encode("utf-8"), frozenset(models) if models else None))
    return keys


class ApiKeys:
    def __init__(
        self, path: Path | None, on_problem: Callable[[str], None] = lambda problem: None
    ) -> None:
        self.path = path
        self.on_problem = on_problem  # told once per new problem (events.py)
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


def may_use(key: Key | None, model: str, names_of: dict[str, str]) -> bool:
    """Whether `key` may use `model` (a primary name); `names_of` maps every served name
    and alias to its primary."""
    return key is None or key.models is None or any(names_of.get(m, m) == model for m in key.models)


def check_scope(key: Key | None, model: str, names_of: dict[str, str]) -> None:
    """403 unless `key` may use `model` (`may_use`)."""
    if not may_use(key, model, names_of):
        raise APIError(
            403,
            f"This API key may not use the model `{model}`.",
            param="model",
            code="model_not_allowed",
        )
