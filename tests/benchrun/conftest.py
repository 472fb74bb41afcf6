"""The deploy tests' fixtures (tiny pair, throw-away checkout, server clean-up), reused by import."""

from __future__ import annotations

from tests.deploy.conftest import checkout, servers, tiny_pair

__all__ = ["checkout", "servers", "tiny_pair"]
