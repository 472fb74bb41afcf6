"""Shared test helpers: read the captured outputs, and stand-ins for host tools (nvidia-smi, hf)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CAPTURES = Path(__file__).parent / "captures"
H200 = CAPTURES / "h200"
SYNTH = CAPTURES / "synthesized"


def h200(name: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one command captured on the H200."""
    return (
        int((H200 / f"{name}.rc").read_text()),
        (H200 / f"{name}.out").read_text(),
        (H200 / f"{name}.err").read_text(),
    )


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
        "esac\nexit 2\n"
    )
    script.chmod(0o755)
    return script


def safetensors_bytes(tensor: str) -> bytes:
    """A real one-tensor safetensors file (float32 [2], zeros), written without torch for speed."""
    header = json.dumps({tensor: {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + bytes(8)


def write_checkpoint(directory: Path, shards: int = 2, index: bool = True) -> Path:
    """A tiny real checkpoint: config.json and safetensors shards named by an index (or one file)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    if not index:
        (directory / "model.safetensors").write_bytes(safetensors_bytes("w"))
        return directory
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        (directory / name).write_bytes(safetensors_bytes(f"w{i}"))
        weight_map[f"w{i}"] = name
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return directory


def fake_hf(bin_dir: Path, log: Path) -> Path:
    """A stand-in `hf` CLI: logs its argv and the token it found where huggingface_hub looks (HF_TOKEN,
    else the file HF_TOKEN_PATH names), then writes a tiny real checkpoint into --local-dir, as
    `hf download` would."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "hf"
    script.write_text(f"""#!{sys.executable}
import json, os, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from pathlib import Path
from tests.provision.helpers import write_checkpoint
argv = sys.argv[1:]
with open({str(log)!r}, "a") as f:
    path = os.environ.get("HF_TOKEN_PATH")
    token = os.environ.get("HF_TOKEN") or (Path(path).read_text().strip() if path else None)
    f.write(json.dumps({{"argv": argv, "token": token, "env": "HF_TOKEN" in os.environ}}) + "\\n")
print(write_checkpoint(Path(argv[argv.index("--local-dir") + 1])))
""")
    script.chmod(0o755)
    return script


def path_with(bin_dir: Path) -> str:
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def run_remote_scripts(*scripts: tuple[str, dict[str, str]]) -> list[tuple[int, str, str]]:
    """Feed each script to this Python on stdin, as the steps do on a host; all at once, to save time."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        for _, env in scripts
    ]
    for proc, (source, _) in zip(procs, scripts, strict=True):
        proc.stdin.write(source)  # small scripts fit the pipe; every process starts right away
        proc.stdin.close()
    results = []
    for proc in procs:
        out, err = proc.stdout.read(), proc.stderr.read()  # stderr stays far below a pipe's buffer
        results.append((proc.wait(timeout=120), out, err))
    return results
