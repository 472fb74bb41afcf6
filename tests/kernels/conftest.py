"""Kernel tests run on the CPU through Triton's interpreter.

TRITON_INTERPRET must be set before ``triton.jit`` decorates our kernels (at import of
``ddtree_kernels.*``), so it is set here, when pytest first loads this folder. On a CUDA machine export
TRITON_INTERPRET=0 to run the same tests on the GPU.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
