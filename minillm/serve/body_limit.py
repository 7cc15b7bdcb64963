"""The request body's size limit, as ASGI middleware in front of the app (minillm.serve.app)."""
from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from . import protocol as P

MAX_BODY_BYTES = 4 * 2**20   # a 131,072-token prompt is under 1 MiB as text or ids; JSON is parsed on the event
                             # loop (a 12 MB body held /health 90-120 ms, minillm.serve.hostile), so no more


class BodyLimit:
    """ASGI middleware: a body over max_bytes is a 413, refused by its Content-Length before it is read, or, sent
    without one (chunked), as soon as what arrived passes the limit (FastAPI re-raises an HTTPException from its
    body read as it is, and _add_error_handlers answers it)."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def too_large(self, size: str) -> HTTPException:
        return HTTPException(413, f"the request body has {size} bytes, above this server's limit of {self.max_bytes}")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        size = dict(scope["headers"]).get(b"content-length", b"").decode()
        if size.isdigit() and int(size) > self.max_bytes:
            response = JSONResponse(P.error_body(self.too_large(size).detail, 413), status_code=413)
            return await response(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b"")) if message["type"] == "http.request" else 0
            if seen > self.max_bytes:
                raise self.too_large(f"more than {self.max_bytes}")
            return message
        await self.app(scope, limited, send)
