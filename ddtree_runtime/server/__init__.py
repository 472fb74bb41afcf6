"""The OpenAI-compatible HTTP server (`python -m ddtree_runtime serve`), one module per concept:

- `settings`: flags, the `--env-file`, defaults;
- `protocol`: the OpenAI request/response models, validation, stream chunks;
- `app`: the FastAPI routes and the per-request log line;
- `worker`: the FIFO queue and the engine thread (batch 1);
- `metrics`: `/metrics` through prometheus_client under vLLM's names;
- `events`: the JSON-lines log;
- `lifecycle`: bind, load and warm, serve on uvicorn, drain on SIGTERM.
"""

from ddtree_runtime.server.lifecycle import run
from ddtree_runtime.server.settings import add_arguments

__all__ = ["add_arguments", "run"]  # what `ddtree_runtime.cli` wires into `serve`
