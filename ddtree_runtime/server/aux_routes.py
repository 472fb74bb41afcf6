"""The endpoints beside the OpenAI API: `/health` and `/ping`, `/version`, `/metrics`, and vLLM's
`/tokenize` and `/detokenize`."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from ddtree_runtime.server.admission import off_loop_if_large, read_json
from ddtree_runtime.server.metrics import CONTENT_TYPE
from ddtree_runtime.server.openapi import body_schema
from ddtree_runtime.server.protocol.errors import APIError
from ddtree_runtime.server.protocol.requests import DetokenizeRequest, TokenizeRequest
from ddtree_runtime.server.protocol.validation import Limits, chat_text
from ddtree_runtime.server.state import State


def add_aux_routes(app: FastAPI, st: State) -> None:
    """Health, version and metrics for operators; tokenize and detokenize for clients."""

    @app.get("/health", summary="200 once loaded and warmed; 503 while loading or draining")
    @app.get("/ping", summary="the same as /health (vLLM, SageMaker)")
    async def health() -> JSONResponse:
        return JSONResponse({"status": st.state}, status_code=200 if st.state == "ready" else 503)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": st.version}

    @app.get("/metrics", summary="Prometheus text format, vLLM's metric names")
    async def metrics() -> Response:
        if st.metrics is None:
            raise APIError(
                503, f"the server is {st.state}", kind="server_error", headers={"Retry-After": "1"}
            )
        return Response(st.metrics.render(*st.scheduler.counts()), media_type=CONTENT_TYPE)

    @app.post("/tokenize", openapi_extra=body_schema(TokenizeRequest))
    async def tokenize(request: Request) -> dict[str, Any]:
        body = _validated(TokenizeRequest, await read_json(request))
        limits, tokenizer, _ = st.ready()
        _check_model(body.model, limits)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "send one of prompt or messages", param="prompt")
        text = body.prompt if body.prompt is not None else chat_text(body.messages or [], body, tokenizer)
        if len(text) > limits.max_prompt_chars:
            raise APIError(400, f"the text has {len(text)} characters (fix: shorten it)", param="prompt")
        special = body.add_special_tokens if body.add_special_tokens is not None else body.prompt is not None
        ids = await off_loop_if_large(request, tokenizer.encode, text, special)
        return {"count": len(ids), "max_model_len": limits.max_model_len, "tokens": ids, "token_strs": None}

    @app.post("/detokenize", openapi_extra=body_schema(DetokenizeRequest))
    async def detokenize(request: Request) -> dict[str, Any]:
        body = _validated(DetokenizeRequest, await read_json(request))
        limits, tokenizer, _ = st.ready()
        _check_model(body.model, limits)
        bad = [t for t in body.tokens if not 0 <= t < limits.vocab_size]
        if bad:
            raise APIError(400, f"token ids {bad[:5]} are outside the vocabulary", param="tokens")
        return {"prompt": tokenizer.decode(body.tokens)}


def _check_model(model: str | None, limits: Limits) -> None:
    if model is not None and model != limits.model:
        raise APIError(404, f"the model {model!r} does not exist", param="model", code="model_not_found")


def _validated(kind: type[BaseModel], body: dict[str, Any]) -> Any:
    try:
        return kind.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise APIError(400, f"{param or 'body'}: {first['msg']}", param=param) from None
