"""The models a frontend serves: the route tables of the deployments it routes to, indexed
by every name a client may send.

A deployment's own frontend reads one `RouteTable`; a TranscriptionGateway's frontend reads
`Routes`, the tables of every deployment it routes to and of those it refused. Either file
becomes one `Catalog` (a table alone is wrapped in a `Routes`), built once per read of the
file (discovery.py re-reads it when it changes), and then only read:

- `resolve(name, scope)`: the table of the deployment that serves `name` (a primary or an
  alias; its primary model is `table.model`). 404 naming the valid names; for a name a
  refused deployment claims, which deployment and why it is not routed; with no deployment
  routed at all, that. 403 if the caller (its key, its tenant) may not use the model. A
  request without a name goes to the table of a one-deployment file (a deployment's own
  frontend, as ever); a gateway has no such default: 400 naming the valid names, so that
  routing one more deployment never changes what a request means.
- `upload_limit(table)`: the file's `max_upload_bytes` bounds every request's body; a
  deployment whose own limit is lower bounds the uploads routed to it (413 naming it).
- the pools of every table (their names are unique across tables: the operator qualifies
  them), by their Service's namespace and name for discovery. The pools of a one-deployment
  file are in the namespace the frontend watches, whatever its table says (as ever); a
  gateway's are in each table's `namespace`.
"""

from __future__ import annotations

from transcription_api.errors import APIError, bad_request, too_large
from transcription_api.multipart import Limit
from transcription_api.routes import PoolRoute, RefusedDeployment, Routes, RouteTable

from .auth import Scope, check_scope


class Catalog:
    def __init__(self, routes: RouteTable | Routes) -> None:
        # A one-deployment file: requests without a `model` go to its table.
        self.default = routes if isinstance(routes, RouteTable) else None
        if isinstance(routes, RouteTable):
            routes = Routes.model_construct(
                deployments=[routes], max_upload_bytes=routes.max_upload_bytes
            )
        self.routes = routes
        self.tables: list[RouteTable] = routes.deployments
        self.pools: list[PoolRoute] = [p for t in self.tables for p in t.pools]
        self.pool_names = {p.name for p in self.pools}
        self._tables = {n: t for t in self.tables for n in t.served_names}
        self.primary_of = {n: t.model for n, t in self._tables.items()}
        self._refused = {n: r for r in routes.refused for n in r.names}
        self._services = {(self._namespace(t), p.service): p for t in self.tables for p in t.pools}

    @property
    def max_upload_bytes(self) -> int:
        return self.routes.max_upload_bytes

    @property
    def names(self) -> list[str]:
        """Every name a client may send, each table's primary first."""
        return list(self._tables)

    @property
    def namespaces(self) -> set[str]:
        """The namespaces whose EndpointSlices list the pools' workers, beside the
        frontend's own."""
        return {t.namespace for t in self.tables} if self.default is None else set()

    def _namespace(self, table: RouteTable) -> str | None:
        return None if self.default is not None else table.namespace

    def pool_for_service(self, namespace: str, service: str) -> PoolRoute | None:
        """The pool whose workers the Service `namespace/service` lists."""
        key = (None if self.default is not None else namespace, service)
        return self._services.get(key)

    # ------------------------------------------------------------------ requests

    def resolve(self, name: str | None, scope: Scope | None = None) -> RouteTable:
        """The table of the deployment serving `name`; APIError 404/400/403 (the module's
        docstring)."""
        table = self._tables.get(name) if name else self.default
        if table is None:
            raise self._unknown(name)
        check_scope(scope, table.model, self.primary_of)
        return table

    def check_session(self, name: str | None, scope: Scope) -> None:
        """The APIError (404, or 403 for a key or tenant scoped to other models) unless a
        realtime session's turns may go to `name`'s deployment: the one a one-deployment
        frontend serves when the session names none (a gateway's session that names none is
        refused nothing: its turns say which names are valid)."""
        if name or self.default is not None:
            self.resolve(name, scope)

    def _unknown(self, name: str | None) -> APIError:
        if not self.tables:
            why = "; ".join(f"{r.deployment}: {_why(r)}" for r in self.routes.refused)
            return APIError(
                404,
                f"The model `{name or ''}` does not exist: this gateway routes no deployment."
                + (f" Not routed: {why}." if why else ""),
                param="model",
            )
        valid = ", ".join(self.names)
        if not name:
            return bad_request(
                f"`model` is required: this gateway routes each request by its model. Valid "
                f"models: {valid}",
                param="model",
                code="missing_model",
            )
        refused = self._refused.get(name)
        if refused is not None:
            return APIError(
                404,
                f"The model `{name}` is claimed by deployment {refused.deployment}, which this "
                f"gateway does not route: {_why(refused)}. Valid models: {valid}",
                param="model",
            )
        return APIError(
            404, f"The model `{name}` does not exist. Valid models: {valid}", param="model"
        )

    def upload_limit(self, table: RouteTable) -> Limit | None:
        """The limit on uploads routed to `table`, where its deployment's is lower than the
        body's (`max_upload_bytes`); None where it is not."""
        limit = table.max_upload_bytes
        if limit >= self.max_upload_bytes:
            return None
        return Limit(limit, too_large(limit, f"the upload limit of deployment {table.deployment}"))


def _why(refused: RefusedDeployment) -> str:
    """Why a deployment is not routed, as the 404s say it."""
    return f"{refused.message.rstrip('.')} ({refused.reason})"
