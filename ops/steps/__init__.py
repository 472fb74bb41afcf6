"""The step registry: every step family of this folder, registered on first use.

Every module in this folder (except ``base``) is a step family following the contract in
``ops/steps/base.py``; it is imported automatically, so adding a family is adding a file. The
families load when the registry is first asked for (``get_step``, ``REGISTRY``), not when the
package is, so importing ``ops.steps.base`` (the runner, the playbook loader) stays cheap. The
domain packages under the steps (``ops/gpu``, ``ops/service``, ``ops/bench``) never import this
package: they build with ``ops/api/``, and the families import them.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from ops.errors import did_you_mean
from ops.steps.base import REGISTRY as _REGISTRY
from ops.steps.base import Step


def _load_families() -> dict[str, type[Step]]:
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        if module != "base":
            importlib.import_module(f"{__name__}.{module}")
    return _REGISTRY


def get_step(name: str) -> type[Step]:
    """The step class registered as ``name``; KeyError carries a did-you-mean hint."""
    registry = _load_families()
    try:
        return registry[name]
    except KeyError:
        hint = did_you_mean(name, registry, f"known steps: {', '.join(sorted(registry))}")
        raise KeyError(hint) from None


def __getattr__(name: str) -> Any:
    if name == "REGISTRY":  # every family registered
        return _load_families()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["REGISTRY", "Step", "get_step"]
