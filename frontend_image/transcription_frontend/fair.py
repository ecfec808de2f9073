"""Fair order in audio seconds: which of the requests waiting for a busy pool gets its next
free worker slot (hold.py keeps the requests; this module only orders them).

Start-time fair queuing (SFQ), per pool and priority class. A request gets, when it first
waits for the pool, a start tag, max(the pool's virtual time, its tenant's last finish
tag), and a finish tag, start + its audio seconds / its tenant's weight; the request with
the smallest start tag goes first (ties: the one tagged first); the virtual time is the
start tag of the request dispatched last. So a tenant that sends more than its share
waits behind its own earlier requests, while one that comes back after a pause starts at
the virtual time: it is not owed the time it was idle, and does not wait behind another
tenant's backlog. A weight is a share: weight 3 gets three seconds of audio through for
each of weight 1's, while both have requests waiting. Interactive requests all go before
batch ones: each class has its own tags and virtual time. A long file cut into chunks is
one request of its tenant per chunk, so another tenant's short request is tagged before
most of them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Flow:
    """Whose a request is, as the queue sees it: its tenant's name and weight, and its
    class (batch: served only while no interactive request waits)."""

    tenant: str = "default"
    weight: int = 1
    batch: bool = False


@dataclass(frozen=True, order=True)
class Tag:
    """A request's place in one pool's order: the smallest goes first."""

    batch: bool
    start: float
    seq: int
    finish: float = field(compare=False)


class FairQueue:
    """The tags of one pool's requests."""

    def __init__(self) -> None:
        self.virtual = {False: 0.0, True: 0.0}  # by class (batch)
        self.finish: dict[tuple[str, bool], float] = {}  # by (tenant, batch)
        self._seq = itertools.count()

    def tag(self, flow: Flow, seconds: float) -> Tag:
        """Tag a request of `flow` with `seconds` of audio (its cost)."""
        key = (flow.tenant, flow.batch)
        start = max(self.virtual[flow.batch], self.finish.get(key, 0.0))
        finish = start + seconds / flow.weight
        self.finish[key] = finish
        return Tag(flow.batch, start, next(self._seq), finish)

    def dispatched(self, tag: Tag) -> None:
        """The request tagged `tag` got a slot: the virtual time moves on to its start."""
        self.virtual[tag.batch] = max(self.virtual[tag.batch], tag.start)
