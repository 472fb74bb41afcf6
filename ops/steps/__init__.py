"""The step registry: importing this package registers every step family.

Every module in this folder (except ``base``) is a step family following the contract in
``ops/steps/base.py``; it is imported here automatically, so adding a family is adding a file.
"""

from __future__ import annotations

import importlib
import pkgutil

from ops.errors import did_you_mean
from ops.steps.base import REGISTRY, Step

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module != "base":
        importlib.import_module(f"{__name__}.{_module}")


def get_step(name: str) -> type[Step]:
    """The step class registered as ``name``; KeyError carries a did-you-mean hint."""
    try:
        return REGISTRY[name]
    except KeyError:
        hint = did_you_mean(name, REGISTRY, f"known steps: {', '.join(sorted(REGISTRY))}")
        raise KeyError(hint) from None


__all__ = ["REGISTRY", "Step", "get_step"]
