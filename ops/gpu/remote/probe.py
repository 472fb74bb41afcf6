"""Host Python facts: interpreter, package versions and, when torch imports, what CUDA it sees.

Run as `<venv>/bin/python - < probe.py`. Versions come from package metadata of EVERY installed
distribution (keys are PEP 503 names), so one probe serves the facts table and the pins comparison;
importing vllm takes seconds and may fail on a broken install (the smoke tests do that on purpose).
`direct_url.json` tells a git-ref install apart from an index release, so a re-run can compare refs.
"""

import contextlib
import importlib.metadata as metadata
import json
import platform
import re
import sys


def packages():
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        info = {"version": dist.version}
        direct = dist.read_text("direct_url.json")
        if direct:
            with contextlib.suppress(ValueError):
                info["direct_url"] = json.loads(direct)
        found[re.sub(r"[-_.]+", "-", name).lower()] = info
    return found


def torch_info():
    try:
        import torch
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    info = {"version": torch.__version__, "cuda": torch.version.cuda, "devices": []}
    try:
        info["cuda_available"] = torch.cuda.is_available()
        if info["cuda_available"]:
            info["arch_list"] = torch.cuda.get_arch_list()
            for index in range(torch.cuda.device_count()):
                major, minor = torch.cuda.get_device_capability(index)
                info["devices"].append(
                    {"name": torch.cuda.get_device_name(index), "capability": [major, minor]}
                )
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


facts = {
    "python": platform.python_version(),
    "executable": sys.executable,
    "packages": packages(),
}
if "torch" in facts["packages"]:
    facts["torch"] = torch_info()
print(json.dumps(facts, sort_keys=True))
