"""The OpenAI-compatible HTTP server (`python -m ddtree_runtime serve`), one module per concept:

- `settings`: flags, the `--env-file`, defaults;
- `protocol/`: the OpenAI wire format (errors, the field-support table, request models,
  validation, response bodies and streamed text);
- `app`: the FastAPI app, assembled from `openai_routes` (`/v1/...`) and `aux_routes` (`/health`,
  `/ping`, `/version`, `/metrics`, `/tokenize`, `/detokenize`), with OpenAI-shaped errors;
- `admission`: the bounded JSON body and the queue's 503; `state`: what every route reads;
- `request_log`: the per-request log line; `openapi`: the `/docs` schemas;
- `worker`: the FIFO queue and the engine thread (batch 1);
- `metrics`: `/metrics` through prometheus_client under vLLM's names;
- `events`: the JSON-lines log;
- `lifecycle`: bind, load and warm, serve on uvicorn, drain on SIGTERM.
"""

from ddtree_runtime.server.lifecycle import run
from ddtree_runtime.server.settings import add_arguments

__all__ = ["add_arguments", "run"]  # what `ddtree_runtime.cli` wires into `serve`
