"""Shared test plumbing: the real-sshd plugin (fixtures sshd_hosts, make_inventory) and the tiny
fitted checkpoint pair that the runtime, server, deploy and bench tests share (fitting it costs ~10 s).

Triton kernels run under the interpreter on machines without an NVIDIA driver (CI). This must be set
before any test module imports ``ddtree_kernels.*``, whichever folder imports it first.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ddtree_runtime.tiny import TinyPair

if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest_plugins = ["tests.sshd", "tests.diskfull"]


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> TinyPair:
    """The fitted pair (64 words, block 6): drafts get accepted, often 3+ at a time."""
    from ddtree_runtime.tiny import write_tiny_pair  # torch: only for the tests that need a pair

    return write_tiny_pair(tmp_path_factory.mktemp("tiny") / "pair")


@pytest.fixture(scope="session")
def hybrid_pair(tmp_path_factory: pytest.TempPathFactory) -> TinyPair:
    """A Qwen3.5-layout hybrid target (3 Gated DeltaNet + 1 full attention, sharded, with vision
    and MTP tensors to skip) and a fitted drafter with a sliding and a full layer."""
    from ddtree_runtime.tiny_hybrid import write_tiny_hybrid_pair

    return write_tiny_hybrid_pair(tmp_path_factory.mktemp("hybrid") / "pair")
