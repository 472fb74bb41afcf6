"""The request bodies as pydantic models: strict types, unknown fields kept (and logged), `/docs`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ddtree_runtime.logprobs import MAX_LOGPROBS

MAX_STOP = 4
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class DDTreeOptions(_Strict):
    """vLLM-style extra: `"ddtree": {"mode": "ddtree", "budget": 64}` (same as the top-level fields)."""

    mode: str | None = None
    budget: int | None = None


class Sampling(_Strict):
    """Fields shared by completions and chat completions."""

    model: str | None = Field(None, description="the served model id (see /v1/models); optional")
    max_tokens: int | None = Field(None, ge=1, le=2**31 - 1)
    max_completion_tokens: int | None = Field(None, ge=1, le=2**31 - 1, description="wins over max_tokens")
    temperature: float | None = Field(
        None, ge=0, le=2, description="default: --temperature, else generation_config.json, else 0"
    )
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    stop: str | list[str] | None = Field(None, description=f"up to {MAX_STOP} strings; [] = none")
    stop_token_ids: list[int] | None = Field(None, description="token ids that end generation (vLLM)")
    ignore_eos: bool = Field(False, description="vLLM extra: keep generating past EOS")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    prompt_logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        description="vLLM extra: each prompt token's logprob, rank and this many most likely (not streamed)",
    )
    truncate_prompt_tokens: int | None = Field(
        None, ge=1, description="vLLM extra: keep only the last N prompt tokens"
    )
    mode: str | None = Field(None, description="specops extra: ar | dflash | ddtree, within --modes")
    budget: int | None = Field(None, description="specops extra: ddtree budget, within --budgets")
    ddtree: DDTreeOptions | None = Field(None, description='specops extra: {"mode": ..., "budget": N}')


class CompletionRequest(Sampling):
    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        description="one prompt: a string or a list of token ids (a one-element list of either is allowed)"
    )
    add_special_tokens: bool = Field(True, description="vLLM extra: the tokenizer's own special tokens (BOS)")
    logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        description="each generated token's logprob and this many most likely tokens' (target, raw logits)",
    )
    echo: bool | None = Field(
        None, description="the prompt (with logprobs: its logprobs too) before the completion"
    )


# ------------------------------------------------------------------------- completions and chat
class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str = Field(description="the arguments as a JSON text, as the model wrote them")


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: str = Field(description=" | ".join(CHAT_ROLES))
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = Field(
        None, description="an assistant's earlier tool calls (needs a chat template that shows them)"
    )
    tool_call_id: str | None = Field(None, description="which call a role tool message answers")

    @model_validator(mode="after")
    def _known_role(self) -> ChatMessage:
        if self.role not in CHAT_ROLES:
            raise ValueError(f"needs a role, one of {', '.join(CHAT_ROLES)}")
        return self

    def plain_text(self) -> str:
        """The content as one string: text parts joined, no content as ""."""
        content = self.content
        return "".join(p.text for p in content) if isinstance(content, list) else content or ""


class ChatTemplateOptions(_Strict):
    """vLLM's chat extras: how the conversation becomes the prompt."""

    add_generation_prompt: bool = Field(True, description="end the prompt with the assistant's turn opened")
    continue_final_message: bool = Field(
        False, description="end the prompt inside the last message, to go on with it"
    )


class ChatCompletionRequest(Sampling, ChatTemplateOptions):
    messages: list[ChatMessage] = Field(min_length=1)
    add_special_tokens: bool = Field(
        False, description="vLLM extra: the tokenizer's own special tokens (BOS)"
    )
    logprobs: bool | None = Field(None, description="each generated token's logprob (target, raw logits)")
    top_logprobs: int | None = Field(
        None, ge=0, le=MAX_LOGPROBS, description="with logprobs: this many most likely tokens per position"
    )


# ------------------------------------------------------------------------ vLLM's auxiliary endpoints
class TokenizeRequest(ChatTemplateOptions):
    """vLLM's `/tokenize`: a prompt, or chat messages through the chat template."""

    model_config = ConfigDict(strict=True, extra="forbid")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = Field(
        None, description="default: true for a prompt, false for messages"
    )


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    model: str | None = None
    tokens: list[int] = Field(description="token ids to turn back into text")


_FIELDS = {
    name
    for model in (
        CompletionRequest,
        ChatCompletionRequest,
        ChatMessage,
        TextPart,
        ToolCall,
        FunctionCall,
        StreamOptions,
        DDTreeOptions,
    )
    for name in model.model_fields
}


def openai_param(loc: tuple[int | str, ...]) -> str | None:
    """A pydantic error location as OpenAI's `param` (`messages[0].content`); union tags dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _FIELDS:
            out += f".{part}" if out else part
        else:
            break
    return out or None
