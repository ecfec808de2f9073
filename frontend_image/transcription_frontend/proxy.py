"""Sending one request to a worker: the multipart body, retries, and the answer.

The body is re-framed, not re-encoded: each form field as the client sent it (with
`model` and `response_format` rewritten for the engine), then the file streamed from the
spool in 64 KiB pieces. Connection failures and 503s are retried on another endpoint
(another pool, if the first has none left), up to `MAX_ATTEMPTS` in all.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from transcription_api.routes import PoolRoute

from . import metrics
from .errors import APIError, unavailable
from .routing import Router
from .upload import Upload

MAX_ATTEMPTS = 3
CHUNK = 64 * 1024


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", " ")


class MultipartBody:
    """A multipart/form-data body streamed from an Upload, with a known length."""

    def __init__(self, fields: list[tuple[str, str]], upload: Upload) -> None:
        self.boundary = uuid.uuid4().hex
        b = self.boundary.encode()
        self.head = b"".join(
            b"--"
            + b
            + b"\r\n"
            + f'Content-Disposition: form-data; name="{_quote(k)}"\r\n\r\n'.encode()
            + v.encode()
            + b"\r\n"
            for k, v in fields
        )
        self.head += (
            b"--"
            + b
            + b"\r\n"
            + b'Content-Disposition: form-data; name="file"; '
            + f'filename="{_quote(upload.filename)}"\r\n'.encode()
            + f"Content-Type: {upload.file_content_type}\r\n\r\n".encode()
        )
        self.tail = b"\r\n--" + b + b"--\r\n"
        self.upload = upload

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    def __len__(self) -> int:
        return len(self.head) + self.upload.size + len(self.tail)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        f = self.upload.file
        assert f is not None
        f.seek(0)
        yield self.head
        while chunk := f.read(CHUNK):
            yield chunk
        yield self.tail


@dataclass
class WorkerAnswer:
    pool: PoolRoute
    url: str
    response: httpx.Response  # not yet read: the caller streams or reads it


class Forwarder:
    def __init__(self, router: Router, client: httpx.AsyncClient) -> None:
        self.router = router
        self.client = client

    async def send(
        self,
        pools: list[PoolRoute],
        path: str,
        fields_for: dict[str, list[tuple[str, str]]],
        upload: Upload,
        request_id: str,
    ) -> WorkerAnswer:
        """Send to the best endpoint of the first pool that has one, retrying on failure.

        `fields_for` maps pool name -> the form fields for that pool's engine. The caller
        must close `answer.response` (and leave the router's tracking with it).
        """
        tried: set[str] = set()
        last_error = "no ready worker"
        attempts = 0
        for pool in pools:
            while attempts < MAX_ATTEMPTS:
                url = self.router.pick(pool.name, tried)
                if url is None:
                    break
                tried.add(url)
                if attempts:
                    metrics.RETRIES.labels(pool=pool.name).inc()
                attempts += 1
                body = MultipartBody(fields_for[pool.name], upload)
                request = self.client.build_request(
                    "POST",
                    url + path,
                    content=body,
                    headers={
                        "content-type": body.content_type,
                        "content-length": str(len(body)),
                        "x-request-id": request_id,
                    },
                )
                self.router.acquire(url, pool.name)
                try:
                    response = await self.client.send(request, stream=True)
                except (
                    httpx.ConnectError,
                    httpx.ConnectTimeout,
                    httpx.RemoteProtocolError,
                    httpx.ReadError,
                    httpx.WriteError,
                ) as e:
                    self.router.release(url, pool.name)
                    self.router.failed(url, pool.name)
                    last_error = (
                        f"worker {url} of pool {pool.name} could not be reached "
                        f"({e.__class__.__name__})"
                    )
                    continue
                except BaseException:
                    self.router.release(url, pool.name)
                    raise
                if response.status_code == 503:
                    await response.aclose()
                    self.router.release(url, pool.name)
                    self.router.failed(url, pool.name)
                    last_error = f"worker {url} of pool {pool.name} is overloaded (503)"
                    continue
                self.router.succeeded(url)
                return WorkerAnswer(pool, url, response)
        names = ", ".join(p.name for p in pools)
        raise unavailable(f"no worker could take the request (pools: {names}): {last_error}")

    def release(self, answer: WorkerAnswer) -> None:
        self.router.release(answer.url, answer.pool.name)


async def worker_error(answer: WorkerAnswer) -> APIError:
    """Turn a worker's non-200 answer into the client's error, in OpenAI's shape."""
    raw = await answer.response.aread()
    status = answer.response.status_code
    message, param, code, type_ = None, None, None, None
    try:
        body: Any = json.loads(raw)
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            message, param, type_ = err.get("message"), err.get("param"), err.get("type")
            code = err.get("code") if isinstance(err.get("code"), str) else None
        elif isinstance(body, dict) and "detail" in body:
            message = str(body["detail"])
    except ValueError:
        pass
    pool = answer.pool
    if status >= 500 or not message:
        # An engine's bare "Internal Server Error" tells the user nothing: say what failed.
        text = message or raw.decode("utf-8", "replace").strip()[:200] or f"HTTP {status}"
        return APIError(
            502,
            f"the {pool.engine.value} worker of pool {pool.name} failed to process the request "
            f"({status}: {text}); check that the file is valid audio, then retry",
            type="server_error",
            code="worker_error",
        )
    if status == 400 and type_ == "BadRequestError" and "Maximum file size" in message:
        return APIError(413, message, param="file")
    return APIError(status, message, param=param, code=code, type=None)
