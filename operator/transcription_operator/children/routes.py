"""The route table (one model, written here and read by the frontend) and its ConfigMap."""

from __future__ import annotations

from transcription_api.engines import Asked
from transcription_api.routes import ROUTES_KEY, PoolRoute, RouteTable, is_english_only
from transcription_api.v1alpha1 import TranscriptionDeployment
from transcription_api.worker import WORKER_PORT

from ..names import pool_object_name, routes_name
from ..plan import Plan
from .meta import Manifest, object_meta
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
                family=p.family,
                english_only=is_english_only(td.spec.model.name, td.spec.model.path),
                worker_model=None if p.profile.aliases else worker_settings(td, p).model_reference,
                transcription_prompt=td.spec.model.transcription_prompt
                if p.serving.asked == Asked.CHAT
                else None,
            )
            for p in the_plan.pools
        ],
    )


def routes_configmap(td: TranscriptionDeployment, table: RouteTable) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(td, routes_name(td), "routes"),
        "data": {ROUTES_KEY: table.dumps()},
    }
