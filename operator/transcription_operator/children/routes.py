"""The route table (one model, written here and read by the frontend) and its ConfigMap: a
deployment's own `RouteTable`, or a gateway's `Routes` (the tables of every deployment it
routes to, their pools named as the gateway's routes name them)."""

from __future__ import annotations

from transcription_api.engines import Asked
from transcription_api.routes import ROUTES_KEY, PoolRoute, Routes, RouteTable, is_english_only
from transcription_api.v1alpha1 import TranscriptionDeployment
from transcription_api.worker import WORKER_PORT

from ..names import pool_object_name, qualified_pool_name, routes_name
from ..plan import Plan
from .meta import Manifest, Owner, object_meta
from .workers import worker_settings


def route_table(td: TranscriptionDeployment, the_plan: Plan) -> RouteTable:
    return RouteTable(
        model=td.spec.model.name,
        aliases=td.spec.model.aliases,
        namespace=td.namespace,
        max_upload_bytes=td.spec.frontend.max_upload_bytes,
        pools=[
            PoolRoute(
                name=p.name,
                engine=p.engine,
                mode=p.mode,
                service=pool_object_name(td, p.name),
                port=WORKER_PORT,
                automatic=p.automatic,
                max_in_flight_per_replica=p.max_in_flight_per_replica,
                family=p.family,
                english_only=is_english_only(td.spec.model.name, td.spec.model.path),
                worker_model=None if p.profile.aliases else worker_settings(td, p).model_reference,
                transcription_prompt=td.spec.model.transcription_prompt
                if p.serving.asked == Asked.CHAT
                else None,
                speakers=p.speakers,
            )
            for p in the_plan.pools
        ],
    )


def gateway_table(
    td: TranscriptionDeployment, the_plan: Plan, gateway_namespace: str
) -> RouteTable:
    """The deployment's table as a gateway's routes hold it: named after the deployment, its
    pools qualified with it (unique across the gateway's tables)."""
    table = route_table(td, the_plan)
    pools = [
        p.model_copy(
            update={"name": qualified_pool_name(td.namespace, td.name, p.name, gateway_namespace)}
        )
        for p in table.pools
    ]
    return table.model_copy(update={"deployment": f"{td.namespace}/{td.name}", "pools": pools})


def routes_configmap(owner: Owner, table: RouteTable | Routes) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(owner, routes_name(owner), "routes"),
        "data": {ROUTES_KEY: table.dumps()},
    }
