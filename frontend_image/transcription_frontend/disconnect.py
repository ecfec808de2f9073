"""Client disconnects: cancel the work (and so the worker request) when the client leaves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from starlette.types import Receive

from transcription_api.errors import APIError


async def _until_disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


@asynccontextmanager
async def cancel_on_disconnect(
    receive: Receive, answered: Callable[[], bool] = lambda: False
) -> AsyncIterator[None]:
    """Cancel the enclosed block if the client disconnects, which then raises APIError(499).

    Enter it only once the request body has been read: one watcher task per request
    listens for the disconnect. Servers report a disconnect once the response is complete
    too; `answered()` tells that one apart.
    """
    current = asyncio.current_task()
    assert current is not None
    gone = False

    def on_disconnect(watcher: asyncio.Task[None]) -> None:
        nonlocal gone
        if not watcher.cancelled() and not answered():
            gone = True
            current.cancel()

    watcher = asyncio.create_task(_until_disconnected(receive))
    watcher.add_done_callback(on_disconnect)
    try:
        yield
    except asyncio.CancelledError:
        if not gone:
            raise
        current.uncancel()
        raise APIError(499, "client closed the request") from None
    finally:
        watcher.remove_done_callback(on_disconnect)
        watcher.cancel()
