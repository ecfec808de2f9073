"""API keys: the accepted keys (one per line in a mounted Secret), re-read when it changes."""

from __future__ import annotations

import hmac
from pathlib import Path

from transcription_api.errors import APIError


class ApiKeys:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._mtime = 0.0
        self._keys: frozenset[str] = frozenset()

    def keys(self) -> frozenset[str]:
        """Accepted keys; none when no file is configured (the gateway is open)."""
        if self.path is None:
            return frozenset()
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            return self._keys  # the Secret is being swapped: keep the last keys
        if mtime != self._mtime:
            lines = self.path.read_text().splitlines()
            self._mtime, self._keys = mtime, frozenset(k.strip() for k in lines if k.strip())
        return self._keys

    def check(self, authorization: str | None) -> None:
        """Raise 401 unless keys are off or `Authorization: Bearer <key>` names one."""
        keys = self.keys()
        if not keys:
            return
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise APIError(401, "Missing API key: send `Authorization: Bearer <key>`.")
        if not any(hmac.compare_digest(token.strip(), k) for k in keys):
            raise APIError(401, "Incorrect API key provided.")
