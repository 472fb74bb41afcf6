"""Which OpenAI fields this server supports, and the refusal for those it does not.

Unknown fields are accepted and named in the request's log line (as vLLM does); fields that would
change the output and are not implemented are refused with a 400 naming the field, never ignored.
"""

from __future__ import annotations

from typing import Any

from ddtree_runtime.server.protocol.errors import APIError

# understood, not supported: accepted only at the value that changes nothing
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "top_k": (-1, 0),
    "min_p": (0, 0.0),
    "min_tokens": (0,),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "chat_template_kwargs": (None, {}),
    # vLLM's extras that change the output and are not implemented
    "use_beam_search": (False,),
    "length_penalty": (1, 1.0),
    "bad_words": (None, []),
    "allowed_token_ids": (None,),
    "logits_processors": (None, []),
    "chat_template": (None,),
    "spaces_between_special_tokens": (True,),
}
NEUTRAL_WHY = {
    "tools": "tool calling is not implemented",
    "tool_choice": "tool calling is not implemented",
    "functions": "tool calling is not implemented",
    "function_call": "tool calling is not implemented",
    "response_format": "constrained decoding (json_object, json_schema) is not implemented",
    "guided_json": "constrained decoding is not implemented",
    "guided_regex": "constrained decoding is not implemented",
    "guided_choice": "constrained decoding is not implemented",
    "guided_grammar": "constrained decoding is not implemented",
    "structured_outputs": "constrained decoding is not implemented",
    "use_beam_search": "beam search is not implemented (speculative decoding samples one sequence)",
    "length_penalty": "it applies to beam search, which is not implemented",
    "bad_words": "restricting the vocabulary is not implemented",
    "allowed_token_ids": "restricting the vocabulary is not implemented",
    "logits_processors": "logits processors are not supported",
    "chat_template": "a per-request chat template is not supported (the model's own is used)",
}


def refuse_unsupported(body: dict[str, Any]) -> None:
    """A 400 for the first understood-but-unsupported field whose value would change the output."""
    for name, allowed in NEUTRAL.items():
        value = body.get(name)
        if value is not None and not any(type(value) is type(a) and value == a for a in allowed):
            why = NEUTRAL_WHY.get(name, "this server does not support it")
            raise APIError(400, f"{name}={value!r} is refused: {why} (fix: leave it out)", param=name)
