"""The server's command line, for any system: ``templates/serve-<system>.argv.j2`` rendered to an
argument vector (one argument per non-blank line), so ``fab deploy`` and the bench matrix start
vLLM, SGLang and our runtime from the same file and no value is ever shell-quoted by hand."""

from __future__ import annotations

from typing import Any

from ops.api.changes import StepFailed
from ops.api.context import StepContext
from ops.api.templates import render_template
from ops.service.systems import DEFAULT_SYSTEM, SYSTEMS, System
from specops_contract import SERVE_DEFAULTS

TEMPLATE_DEFAULTS: dict[str, Any] = {
    "served_name": None,
    "num_speculative_tokens": None,
    "tensor_parallel": None,
    "dtype": None,  # unset: each system picks for the hardware
    "max_context": None,
    "cost_table": None,
    "extra_args": [],
}


def render_argv(template: str, context: dict[str, Any], ctx: StepContext) -> list[str]:
    """A ``*.argv.j2`` template rendered to an argument vector: one argument per non-blank line."""
    text = render_template(template, context, ctx).decode("utf-8")
    argv = [line.strip() for line in text.splitlines() if line.strip()]
    if not argv:
        raise StepFailed(f"template {template} rendered no command line")
    return argv


def system_of(args: dict[str, Any]) -> System:
    return SYSTEMS[args["serve"].get("system", DEFAULT_SYSTEM)]


def system_venv(args: dict[str, Any]) -> str:
    """The venv the server runs from: the service's ``venv`` for ours, else ``serve.venv`` or the
    system's own ``<base>/venvs/<system>``."""
    system = system_of(args)
    if system.name == DEFAULT_SYSTEM:
        return args.get("venv") or system.venv(args["base"])
    return args["serve"].get("venv") or system.venv(args["base"])


def serve_device(serve: dict[str, Any], ctx: StepContext) -> str:
    """Our server's device: ``serve.device``, else the CPU on a ``profile: cpu`` host, else CUDA."""
    return serve.get("device") or ("cpu" if ctx.vars.get("profile") == "cpu" else "cuda")


def serve_context(args: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    """The template variables of the service arguments: the inventory's ``serve`` with defaults."""
    serve = {**SERVE_DEFAULTS, **args["serve"]}
    context = {
        **TEMPLATE_DEFAULTS,
        **serve,
        "venv": system_venv(args),
        "target": args["target"],
        "drafter": args["drafter"],
        "env_file": args["env_file"],
        "device": serve_device(serve, ctx),
    }
    context.pop("system", None)
    return context


def serve_argv(args: dict[str, Any], ctx: StepContext) -> list[str]:
    """The server's command line: paths and numbers only. Secrets, and our server's other
    ``SPECOPS_SERVE_*`` settings, are in the environment file the process is started with."""
    return render_argv(system_of(args).template, serve_context(args, ctx), ctx)


def served_id(args: dict[str, Any]) -> str | None:
    """The model id a foreign server lists on /v1/models (its served name, else the model path);
    None for ours, whose /health already means ready."""
    if system_of(args).name == DEFAULT_SYSTEM:
        return None
    return args["serve"].get("served_name") or args["target"]
