"""The OpenAI wire format, one module per concept:

- `errors`: `APIError`, OpenAI's error body (`{"error": {message, type, param, code}}`), which the
  `openai` client turns into its typed exceptions;
- `fields`: which OpenAI fields are understood but not supported, refused unless neutral;
- `requests`: the request bodies as pydantic models (they document themselves at `/docs`);
- `validation`: a body checked against the served model's `Limits` into an engine-ready `Request`;
- `responses`: response bodies, stream chunks and streamed text.

Everything a client sends is checked before anything is queued, so a bad request costs no engine
time and gets a 4xx. Shapes follow OpenAI's API and what vLLM's `bench serve` sends.
"""
