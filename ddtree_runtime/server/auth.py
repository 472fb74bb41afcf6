"""`--api-key`, as vLLM has it: requests must carry `Authorization: Bearer <key>`.

The key guards `/v1/*` (the OpenAI API); `/health`, `/metrics` and the other operator routes stay
open, so probes and scrapers need no secret, unless `--api-key-routes all` guards every route. The
comparison takes the same time whatever the sent value shares with the key (`hmac.compare_digest`),
so the key cannot be guessed byte by byte from response times. A refusal is OpenAI's 401 error body.
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from ddtree_runtime.server.protocol.errors import APIError
from ddtree_runtime.server.request_log import RECORD


class ApiKeyGuard:
    """ASGI middleware: a 401 for a guarded route without the right bearer token."""

    def __init__(self, app: ASGIApp, key: str, every_route: bool) -> None:
        self.app, self.every_route = app, every_route
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._guarded(scope["path"]):
            await self.app(scope, receive, send)
            return
        sent = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        if hmac.compare_digest(sent, self.expected):
            await self.app(scope, receive, send)
            return
        error = APIError(
            401,
            "missing or wrong API key (fix: send the header Authorization: Bearer <key>, the key the "
            "server was started with)",
            code="invalid_api_key",
        )
        scope.setdefault(RECORD, {})["error"] = "missing or wrong API key"
        body = json.dumps(error.body()).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _guarded(self, path: str) -> bool:
        return self.every_route or path == "/v1" or path.startswith("/v1/")
