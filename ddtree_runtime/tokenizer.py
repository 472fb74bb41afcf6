"""Tokenizer from `tokenizer.json` (the `tokenizers` library) plus the chat template, if any.

The chat template lives in `tokenizer_config.json` (or `chat_template.jinja`) and is rendered with a
sandboxed Jinja2 environment set up the way transformers renders it, so prompts match the model's
training format without importing transformers on the GPU host.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

from jinja2 import Template, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from ddtree_runtime.config import ConfigError, read_json
from drafter_config.source import MAX_JSON_BYTES


def _raise(message: str) -> None:
    raise ConfigError(f"chat template: {message}")


class Tokenizer:
    def __init__(self, directory: str | Path) -> None:
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.exists():
            raise ConfigError(
                f"{path}: missing (fix: copy the model's tokenizer.json next to its config.json)"
            )
        info = path.stat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_JSON_BYTES:
            raise ConfigError(
                f"{path}: not a regular file of at most {MAX_JSON_BYTES} bytes (fix: point at the real file)"
            )
        try:
            self.tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # the Rust library's errors: a file downloaded from the internet
            raise ConfigError(
                f"{path}: not a tokenizer the tokenizers library can read ({' '.join(str(e).split())[:200]}) "
                "(fix: copy the model's own tokenizer.json)"
            ) from None
        cfg_path = directory / "tokenizer_config.json"
        cfg = read_json(cfg_path) if cfg_path.exists() else {}
        template = cfg.get("chat_template")
        jinja_file = directory / "chat_template.jinja"
        if template is None and jinja_file.exists():
            template = jinja_file.read_text()
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        self.chat_template = template
        self._template = None if template is None else _compile(template, directory)
        self.special = {k: _token_text(cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token")}
        self.eos_token_id = self.token_id(self.special["eos_token"])

    def token_id(self, text: str | None) -> int | None:
        return None if text is None else self.tok.token_to_id(text)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids; ``add_special_tokens`` adds what the tokenizer's post-processor adds (a BOS)."""
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def token_text(self, token: int) -> str:
        """One token's own text, a special token's too (logprobs name every token they rank)."""
        return self.tok.decode([token], skip_special_tokens=False)

    @property
    def renders_tool_calls(self) -> bool:
        """Whether the chat template shows an assistant message's ``tool_calls`` at all."""
        return self.chat_template is not None and "tool_calls" in self.chat_template

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> str:
        """The prompt text for a conversation: by default ending with the assistant's turn opened;
        ``continue_final_message`` ends it inside the last message instead, so the model goes on
        writing it (transformers' rule: the text up to the end of that message's content)."""
        if self._template is None:
            raise ConfigError("this tokenizer has no chat template (fix: send a plain prompt)")
        open_turn = add_generation_prompt and not continue_final_message
        text = self._template.render(messages=messages, add_generation_prompt=open_turn, **self.special)
        if not continue_final_message:
            return text
        final = str(messages[-1].get("content") or "").strip()
        end = text.rfind(final) if final else -1
        if end < 0:
            raise ConfigError("continue_final_message: the last message's text is empty or not in the prompt")
        return text[: end + len(final)]

    def prompt_ids(self, text: str) -> list[int]:
        """Token ids for a user prompt: through the chat template when the model has one."""
        if self.chat_template is not None:
            text = self.apply_chat_template([{"role": "user", "content": text}])
        return self.encode(text)


def _compile(template: str, directory: Path) -> Template:
    """Compiled once at load: compiling costs about a millisecond, every request would pay it."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    try:
        return env.from_string(template)
    except TemplateSyntaxError as e:
        raise ConfigError(f"{directory}: chat template line {e.lineno}: {e.message}") from None


def _token_text(value: Any) -> str | None:
    """tokenizer_config stores special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value
