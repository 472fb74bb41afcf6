"""Shared test helpers: read the captured outputs, and stand-ins for host tools (nvidia-smi, hf)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

CAPTURES = Path(__file__).parent / "captures"
H200 = CAPTURES / "h200"
SYNTH = CAPTURES / "synthesized"


def h200(name: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one command captured on the H200."""
    return (int((H200 / f"{name}.rc").read_text()), (H200 / f"{name}.out").read_text(),
            (H200 / f"{name}.err").read_text())


def synth(name: str) -> str:
    return (SYNTH / name).read_text()


def fake_nvidia_smi(bin_dir: Path, query: Path | None, version: Path | None, query_rc: int = 0) -> Path:
    """An `nvidia-smi` that prints a capture: `--query-gpu=...` -> query, `--version` -> version."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  --query-gpu=*) cat {query}; exit {query_rc};;\n"
        f"  --version) cat {version}; exit 0;;\n"
        "esac\nexit 2\n")
    script.chmod(0o755)
    return script


def fake_hf(bin_dir: Path, log: Path) -> Path:
    """A stand-in `hf` CLI: logs argv and whether HF_TOKEN was in its environment, then writes a tiny
    real checkpoint (config.json, a 2-shard safetensors index and its shards) into --local-dir."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "hf"
    script.write_text(f"""#!{sys.executable}
import json, os, sys
from pathlib import Path
import torch
from safetensors.torch import save_file
argv = sys.argv[1:]
with open({str(log)!r}, "a") as f:
    f.write(json.dumps({{"argv": argv, "token": os.environ.get("HF_TOKEN")}}) + "\\n")
out = Path(argv[argv.index("--local-dir") + 1])
out.mkdir(parents=True, exist_ok=True)
(out / "config.json").write_text(json.dumps({{"model_type": "qwen3", "repo": argv[1]}}))
shards = {{"model-00001-of-00002.safetensors": "a", "model-00002-of-00002.safetensors": "b"}}
for shard, key in shards.items():
    save_file({{key: torch.zeros(2)}}, str(out / shard))
index = {{"metadata": {{}}, "weight_map": {{key: shard for shard, key in shards.items()}}}}
(out / "model.safetensors.index.json").write_text(json.dumps(index))
print(out)
""")
    script.chmod(0o755)
    return script


def write_checkpoint(directory: Path, shards: int = 2, index: bool = True) -> Path:
    """A tiny real checkpoint written locally: config.json and safetensors shards (+ index)."""
    import torch
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    if not index:
        save_file({"w": torch.zeros(2)}, str(directory / "model.safetensors"))
        return directory
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        save_file({f"w{i}": torch.zeros(2)}, str(directory / name))
        weight_map[f"w{i}"] = name
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


def path_with(bin_dir: Path) -> str:
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
