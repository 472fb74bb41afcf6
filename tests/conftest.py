"""Shared test plumbing: the real-sshd plugin (fixtures sshd_hosts, make_inventory).

Triton kernels run under the interpreter on machines without an NVIDIA driver (CI). This must be set
before any test module imports ``kernels.*``, whichever folder imports it first.
"""

from __future__ import annotations

import os
import shutil

if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest_plugins = ["tests.sshd"]
