"""The deploy tests' fixtures (throw-away checkout, server clean-up), reused by import."""

from __future__ import annotations

from tests.deploy.conftest import checkout, servers

__all__ = ["checkout", "servers"]
