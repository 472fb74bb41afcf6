"""The HTTP app: FastAPI (served by uvicorn) over the shared `State`, wrapped in the request log.

The routes live in `openai_routes` (the OpenAI API) and `aux_routes` (health, version, metrics,
tokenize); this module assembles them, behind the `--api-key` guard when one is set (`auth`), and
turns every error, including FastAPI's own 404/405 and a handler bug, into OpenAI's error body.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp

from ddtree_runtime.server.auth import ApiKeyGuard
from ddtree_runtime.server.aux_routes import add_aux_routes
from ddtree_runtime.server.openai_routes import add_openai_routes
from ddtree_runtime.server.openapi import add_schemas
from ddtree_runtime.server.protocol.errors import APIError
from ddtree_runtime.server.request_log import RequestLog, record_of
from ddtree_runtime.server.state import State


def build_app(st: State) -> ASGIApp:
    """The routes; the returned app is wrapped in the request log."""
    app = FastAPI(title="specops DDTree server", version=st.version, openapi_url="/openapi.json")

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        record_of(request)["error"] = e.message
        return _error(e)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        method, path = request.method, request.url.path
        if e.status_code == 404:
            message = f"no route {method} {path} (fix: see /docs for the routes)"
            return _error(APIError(404, message, code="not_found"))
        if e.status_code == 405:
            message = f"{method} is not allowed on {path} (fix: one of {(e.headers or {}).get('Allow', '')})"
            return _error(APIError(405, message, code="method_not_allowed", headers=dict(e.headers or {})))
        return _error(APIError(e.status_code, str(e.detail)))

    @app.exception_handler(Exception)
    async def bug(_: Request, e: Exception) -> JSONResponse:
        return _error(APIError(500, "internal error", kind="server_error"))

    add_aux_routes(app, st)
    add_openai_routes(app, st)
    add_schemas(app)
    s = st.settings
    guarded: ASGIApp = app if s.api_key is None else ApiKeyGuard(app, s.api_key, s.api_key_routes == "all")
    return RequestLog(guarded, st.log)


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
