"""Hostile checkpoints, issue 27 item 7: absurd, negative or zero sizes, safetensors headers that lie
about shapes and dtypes, a garbage tokenizer.json. Every size is bounded before anything is
enumerated or allocated (`drafter_config/bounds.py`), and each case is one line and exit 2, from the
lint (`specops config lint`) and from the runtime (`python -m ddtree_runtime generate`), never a
traceback, minutes or gigabytes."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from ddtree_runtime import cli as runtime_cli
from ops.cli import main as specops


def copy_pair(tiny_pair, folder: Path) -> tuple[Path, Path]:
    target, drafter = folder / "target", folder / "drafter"
    shutil.copytree(tiny_pair.target, target)
    shutil.copytree(tiny_pair.drafter, drafter)
    return target, drafter


def edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))


def edit_header(path: Path, edit) -> None:
    """Rewrite a safetensors header through `edit(header)`, keeping its data bytes."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    edit(header)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length :])


def one_line(err: str) -> str:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def drafter_set(key: str, value):
    return lambda config: config.update({key: value})


@pytest.mark.parametrize(
    ("role", "edit", "said"),
    [
        ("drafter", drafter_set("num_hidden_layers", 10**6), "num_hidden_layers is 1000000, outside 1..1024"),
        ("drafter", drafter_set("block_size", 10**8), "block_size is 100000000, more than 256"),
        ("drafter", drafter_set("num_attention_heads", 0), "num_attention_heads is 0, outside 1..1024"),
        ("drafter", drafter_set("hidden_size", -64), "hidden_size is -64, outside 1..65536"),
        ("drafter", drafter_set("intermediate_size", 1.5), "intermediate_size is 1.5, not a whole number"),
        # a Qwen3.5 target without layer_types: its layer kinds used to be derived one per layer
        ("target", lambda c: c.update(text_config={**c, "model_type": "qwen3_5_text",
                                                  "num_hidden_layers": 10**9}, model_type="qwen3_5"),
         "text_config.num_hidden_layers is 1000000000, outside 1..1024"),
    ],
)  # fmt: skip
def test_the_lint_bounds_every_size_first(tiny_pair, tmp_path, capsys, role, edit, said):
    target, drafter = copy_pair(tiny_pair, tmp_path)
    config = (drafter if role == "drafter" else target) / "config.json"
    edit_json(config, edit)
    assert specops(["config", "lint", str(drafter), "--target", str(target)]) == 2
    err = one_line(capsys.readouterr().err)
    assert f"{config}:" in err and said in err and "(fix: correct " in err


def generate(target: Path, drafter: Path | None, *extra: str) -> int:
    argv = ["generate", "--target", str(target), "--device", "cpu", "--dtype", "float32",
            "--max-new-tokens", "2", "--prompt-ids", "5,6,7"]  # fmt: skip
    if drafter is None:
        return runtime_cli.main([*argv, "--mode", "ar", *extra])
    return runtime_cli.main([*argv, "--drafter", str(drafter), "--mode", "ddtree", "--budget", "4", *extra])


def _shape_lie(header):  # one tensor's shape no longer fits its bytes
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = [dim * 2 for dim in header[name]["shape"]]


def _dtype_lie(header):
    name = next(k for k in header if k != "__metadata__")
    header[name]["dtype"] = "F16"


def _transposed(header):  # the same bytes, another shape than the config implies
    name = next(k for k in header if k.endswith("mlp.down_proj.weight"))
    header[name]["shape"] = header[name]["shape"][::-1]


@pytest.mark.parametrize(
    ("what", "said"),
    [
        ("vocab", "vocab_size is -5, outside 1..4194304"),
        ("heads", "num_attention_heads is 0, outside 1..1024"),
        ("block", "block_size is 100000000, more than 256"),
        ("shape lie", "not a readable safetensors file"),
        ("dtype lie", "not a readable safetensors file"),
        ("transposed", "weights do not match the config: size mismatch for layers.0.mlp.down_proj.weight"),
        ("tokenizer", "not a tokenizer the tokenizers library can read"),
    ],
)
def test_the_runtime_refuses_a_hostile_checkpoint_in_one_line(tiny_pair, tmp_path, capsys, what, said):
    target, drafter = copy_pair(tiny_pair, tmp_path)
    uses_drafter = what == "block"
    if what == "vocab":
        edit_json(target / "config.json", lambda c: c.update(vocab_size=-5))
    elif what == "heads":
        edit_json(target / "config.json", lambda c: c.update(num_attention_heads=0))
    elif what == "block":
        edit_json(drafter / "config.json", lambda c: c.update(block_size=10**8))
    elif what == "tokenizer":
        (target / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": 7}}')
    else:
        edit = {"shape lie": _shape_lie, "dtype lie": _dtype_lie, "transposed": _transposed}[what]
        edit_header(target / "model.safetensors", edit)
    assert generate(target, drafter if uses_drafter else None) == 2
    err = one_line(capsys.readouterr().err)
    assert err.startswith("error: ") and said in err, err
