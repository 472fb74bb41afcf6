"""The serving systems a host can run, and what the lifecycle needs to know about each.

``fab deploy`` runs our DDTree runtime, vLLM or SGLang (the inventory's ``serve.system``) through
one lifecycle: a command line rendered from ``templates/serve-<system>.argv.j2`` (the bench
matrix renders the same file), a venv of its own (vLLM and SGLang pin different torch builds),
the packages whose versions the release record keeps, how readiness is judged, which modes read
a drafter, and the config fields to name when a deployment's acceptance is too low.

The flags the vLLM and SGLang templates emit were checked against the sources of the pinned
versions (``playbooks/pins.yaml``): vLLM 0.34.0 (``vllm/engine/arg_utils.py``,
``vllm/entrypoints/common/cli_args.py``, ``vllm/config/speculative.py``) and SGLang 0.5.23
(``sglang/srt/arg_groups/fields/*.py``, ``sglang/srt/arg_groups/speculative_hook.py``); the test
stand-in (``tests/deploy/standin.py``) accepts exactly those flags.
"""

from __future__ import annotations

from dataclasses import dataclass

from ops.layout import HostLayout
from specops_contract import MODES


@dataclass(frozen=True)
class System:
    """One serving system: its modes, command-line template, venv, pins and readiness rule."""

    name: str
    modes: tuple[str, ...]
    packages: tuple[str, ...]  # PEP 503 names whose installed versions the release record keeps
    drafter_modes: tuple[str, ...]  # modes that load a DFlash drafter (the lint gate runs first)
    follows_release: bool  # a new specops release restarts it (only our runtime runs from one)

    @property
    def template(self) -> str:
        return f"serve-{self.name}.argv.j2"

    def venv(self, base: str) -> str:
        """Its own venv: ``<base>/venv`` for our runtime, ``<base>/venvs/<system>`` otherwise."""
        layout = HostLayout(base)
        return layout.venv if self.name == "ddtree" else layout.system_venv(self.name)

    @property
    def ready_on(self) -> str:
        """``health``: our /health is 200 once warmed. ``models``: vLLM's /health is 200 while the
        engine loads, so readiness is the port accepting, then /v1/models listing the model."""
        return "health" if self.name == "ddtree" else "models"


SYSTEMS: dict[str, System] = {
    "ddtree": System(
        "ddtree",
        MODES,
        ("torch", "triton", "transformers"),
        drafter_modes=MODES,  # our server loads the drafter in every mode
        follows_release=True,
    ),
    "vllm": System(
        "vllm",
        ("ar", "dflash", "mtp", "eagle", "eagle3", "ngram"),
        ("vllm", "torch", "triton", "flashinfer-python", "transformers"),
        drafter_modes=("dflash",),
        follows_release=False,
    ),
    "sglang": System(
        "sglang",
        ("ar", "mtp", "eagle", "eagle3", "ngram", "dflash"),
        ("sglang", "torch", "sglang-kernel", "flashinfer-python", "transformers"),
        drafter_modes=("dflash",),
        follows_release=False,
    ),
}
DEFAULT_SYSTEM = "ddtree"


def system_named(name: str) -> System:
    if name not in SYSTEMS:
        raise ValueError(f"serve.system: expected one of {', '.join(SYSTEMS)}, got {name!r}")
    return SYSTEMS[name]
