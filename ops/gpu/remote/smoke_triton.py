"""Smoke test: a small Triton kernel compiles for the device and computes the right answer.

Triton compiles through its own bundled ptxas, so this catches an old Triton without the device's
arch (sm_120 needs Triton >= 3.3) even when torch itself is fine. `@triton.jit` reads its function's
source file, and this script arrives on stdin, so the kernel is written to a temporary module first.
"""

import importlib.util
import json
import os
import tempfile

KERNEL = """
import triton
import triton.language as tl


@triton.jit
def scale_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, 2.0 * x + y, mask=mask)
"""

result = {"triton": None, "error": None}
try:
    import torch
    import triton

    result["triton"] = triton.__version__
    with tempfile.TemporaryDirectory(prefix="specops-smoke-") as tmp:
        path = os.path.join(tmp, "specops_smoke_kernel.py")
        with open(path, "w") as f:
            f.write(KERNEL)
        spec = importlib.util.spec_from_file_location("specops_smoke_kernel", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
        n = 4099
        x = torch.randn(n, device=device)
        y = torch.randn(n, device=device)
        out = torch.empty_like(x)
        module.scale_add[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        if device == "cuda":
            torch.cuda.synchronize()
            result["device"] = torch.cuda.get_device_name(0)
        else:
            result["device"] = "cpu (TRITON_INTERPRET=1)"
        result["max_abs_error"] = float((out - (2.0 * x + y)).abs().max().item())
except Exception as exc:
    result["error"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:2000]
print(json.dumps(result, sort_keys=True))
