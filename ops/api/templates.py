"""Jinja2 templates rendered with a host's variables: the ``template`` step's files, the service's
systemd unit and the benchmark's foreign-server command lines all go through :func:`render_template`.
"""

from __future__ import annotations

import functools
from typing import Any

import jinja2

from ops.api.changes import StepFailed
from ops.api.context import StepContext
from ops.envfile import FILTERS as ENV_FILE_FILTERS
from ops.envfile import EnvLineError


@functools.lru_cache(maxsize=64)
def _template_env(*search_path: str) -> jinja2.Environment:
    """One environment per search path, so a template compiles once per run, not once per host."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(list(search_path)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters.update(ENV_FILE_FILTERS)  # env_key, env_value, one_line: see ops/envfile.py
    return env


def render_template(src: str, extra: dict[str, Any] | None, ctx: StepContext) -> bytes:
    """Render a Jinja2 template with the host's variables (+ ``extra``); an undefined name is an error."""
    path = ctx.find_source(src)
    env = _template_env(str(path.parent), str(ctx.templates_dir))
    try:
        return env.get_template(path.name).render({**ctx.vars, **(extra or {})}).encode("utf-8")
    except jinja2.UndefinedError as exc:
        raise StepFailed(
            f"template {path}: {exc.message} (define it in inventory vars or register it)"
        ) from None
    except jinja2.TemplateSyntaxError as exc:
        raise StepFailed(f"template {exc.filename or path}:{exc.lineno}: {exc.message}") from None
    except EnvLineError as exc:
        raise StepFailed(f"template {path}: {exc}") from None
