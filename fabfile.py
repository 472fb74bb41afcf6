"""Fabric entry point: `fab --list` from the repo root shows the specops tasks (ops/tasks.py)."""

from ops.tasks import ns

__all__ = ["ns"]
