"""Smoke test: torch sees every GPU and really runs a kernel on each.

A wheel built without the device's arch imports fine and reports the GPU; only a launched kernel
fails ("no kernel image is available for execution on the device"), so this launches one.
"""

import json

import torch

result = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
result["arch_list"] = torch.cuda.get_arch_list() if result["cuda_available"] else []
result["devices"] = []
for index in range(torch.cuda.device_count() if result["cuda_available"] else 0):
    major, minor = torch.cuda.get_device_capability(index)
    device = {"index": index, "name": torch.cuda.get_device_name(index), "capability": [major, minor]}
    try:
        x = torch.arange(1024, device=f"cuda:{index}", dtype=torch.float32)
        device["sum"] = float((x * 2.0).sum().item())
        device["error"] = None
    except Exception as exc:
        device["error"] = " ".join(f"{type(exc).__name__}: {exc}".split())
    result["devices"].append(device)
print(json.dumps(result, sort_keys=True))
