"""Which namespaces the operator watches: every one, some by name, or some by pattern.

`--namespace` (repeatable) and `WATCH_NAMESPACES` (comma-separated) take names and patterns:
`team-*` and `asr-?` are shell globs (`*`, `?`, `[...]`); `!name` or `!glob` leaves
namespaces out. A namespace is watched when it matches a positive entry (or there are none)
and no `!` entry: `-n 'team-*' -n '!team-ci-*'`, or `-n '!sandbox-*'` for every namespace but
those.

Names only: the operator lists and watches those namespaces, with a Role in each (the
chart's namespaced mode). With a pattern it must see every namespace to know which match,
so it reads cluster-wide (a ClusterRole, as watching every namespace does) and keeps only
what the scope admits: one watch per kind, not one per namespace.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

GLOB = re.compile(r"[*?\[]")
# A namespace (a DNS label), or a glob of one, with an optional leading `!`.
SPEC = re.compile(r"!?[a-z0-9*?\[\]-]{1,63}")


def is_pattern(spec: str) -> bool:
    return spec.startswith("!") or bool(GLOB.search(spec))


def check(spec: str) -> str:
    """One namespace or pattern, as given; a ValueError that says what is wrong."""
    if "," in spec:
        raise ValueError(
            f"namespace {spec!r}: one namespace or pattern per entry (repeat --namespace)"
        )
    if not SPEC.fullmatch(spec) or spec == "!":
        raise ValueError(
            f"namespace {spec!r}: neither a namespace name (lower-case letters, digits, '-') "
            "nor a pattern of one ('*', '?', '[...]', and '!' in front to leave them out)"
        )
    return spec


@dataclass(frozen=True)
class Scope:
    """The namespaces to watch; no entries: every namespace."""

    specs: tuple[str, ...] = ()

    @classmethod
    def of(cls, specs: list[str] | tuple[str, ...]) -> Scope:
        return cls(tuple(check(s.strip()) for s in specs if s.strip()))

    @property
    def cluster_wide(self) -> bool:
        """It reads every namespace: none named, or a pattern among them."""
        return not self.specs or any(map(is_pattern, self.specs))

    @property
    def listed(self) -> tuple[str | None, ...]:
        """What to list: each named namespace, or (None,) for all of them at once."""
        return (None,) if self.cluster_wide else self.specs

    @cached_property
    def _positive(self) -> tuple[str, ...]:
        return tuple(s for s in self.specs if not s.startswith("!"))

    @cached_property
    def _negative(self) -> tuple[str, ...]:
        return tuple(s[1:] for s in self.specs if s.startswith("!"))

    def admits(self, namespace: str) -> bool:
        """Asked of every watch event: the entries are split once, not per call."""
        if self._positive and not any(fnmatch.fnmatchcase(namespace, p) for p in self._positive):
            return False
        return not any(fnmatch.fnmatchcase(namespace, n) for n in self._negative)

    def admits_object(self, obj: dict[str, Any]) -> bool:
        """A namespaced object by its namespace; a Namespace by its name."""
        meta = obj.get("metadata") or {}
        if obj.get("kind") == "Namespace":
            return self.admits(str(meta.get("name", "")))
        return self.admits(str(meta.get("namespace", "")))

    def __str__(self) -> str:
        return ", ".join(self.specs) if self.specs else "all namespaces"
