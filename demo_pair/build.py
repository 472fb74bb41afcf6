"""Regenerate the demo pair: `python demo_pair/build.py [--out demo_pair]` (CPU, about 20 minutes).

1. The target: a small Qwen3 LM with its own byte-level BPE, trained from scratch on the Python
   standard library's sources (ddtree_runtime/train/lm.py), which every machine has offline.
2. Its DFlash drafter, trained by the pipeline (`python -m ddtree_runtime.train`): prompts are code
   snippets from the training files; the held-out stdlib files supply the evaluation prompts.

Both land under `--out` (target/ and drafter/, bf16), with `eval.json` holding τ at T=0. Each stage
is skipped when its output exists, so a rerun resumes; the work directory is `--work`.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

import torch

from ddtree_runtime.train.__main__ import main as train_main
from ddtree_runtime.train.lm import LMSpec, is_held_out, read_texts, stdlib_files, train_lm

HERE = Path(__file__).resolve().parent


def snippets(files: list[Path], n: int, seed: int, chars: tuple[int, int] = (160, 400)) -> list[str]:
    """`n` code snippets that start at a line start, from random places in random files."""
    rng = random.Random(seed)
    texts = [t for t in read_texts(files, 10**9) if len(t) > chars[1] * 2]
    out = []
    while len(out) < n:
        text = rng.choice(texts)
        start = text.rfind("\n", 0, rng.randrange(len(text) - chars[1])) + 1
        snippet = text[start : start + rng.randint(*chars)]
        if snippet.strip():
            out.append(snippet)
    return out


def write_jsonl(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(HERE), help="where target/ and drafter/ go (default: demo_pair/)")
    p.add_argument("--work", default="/tmp/specops-demo-pair", help="work directory (resumable)")
    p.add_argument("--lm-steps", type=int, default=LMSpec.steps)
    p.add_argument("--train-prompts", type=int, default=960)
    p.add_argument("--eval-prompts", type=int, default=16)
    p.add_argument("--drafter-steps", type=int, default=1500)
    p.add_argument("--response-tokens", type=int, default=128, help="target tokens regenerated per prompt")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the demo CPU is shared)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    out, work = Path(a.out), Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    target = work / "target"
    if not (target / "model.safetensors").exists():
        train_lm(target, LMSpec(steps=a.lm_steps))
    files = stdlib_files()
    train_files = [f for f in files if not is_held_out(f)]
    held_files = [f for f in files if is_held_out(f)]
    train_p = write_jsonl(work / "train_prompts.jsonl", snippets(train_files, a.train_prompts, seed=1))
    held_p = write_jsonl(work / "held_out_prompts.jsonl", snippets(held_files, a.eval_prompts, seed=2))
    run = work / "run"
    code = train_main([
        "--target", str(target), "--prompts", str(train_p), "--held-out-prompts", str(held_p),
        "--out", str(run), "--held-out", "0", "--min-chars", "16", "--near-dup", "0.9",
        "--max-prompt-tokens", "128", "--response-tokens", str(a.response_tokens), "--draft-layers", "1", "--block-size", "8",
        "--target-layer-ids", "1,3", "--steps", str(a.drafter_steps), "--lr", "1e-3", "--warmup-steps", "20",
        "--micro-batch", "4", "--anchors", "24", "--loss-gamma", "4", "--save-every", "50",
        "--eval-prompts", str(a.eval_prompts), "--eval-budgets", "16,32,64", "--eval-tokens", "96",
        "--device", "cpu", "--no-bf16", "--save-dtype", "bfloat16",
    ])  # fmt: skip
    if code:
        return code
    for name, src in (("target", target), ("drafter", run / "drafter")):
        shutil.rmtree(out / name, ignore_errors=True)
        shutil.copytree(src, out / name, ignore=shutil.ignore_patterns("train_spec.json"))
    shutil.copy(target / "train_spec.json", out / "target_train_spec.json")
    shutil.copy(run / "eval.json", out / "eval.json")
    shutil.copy(run / "data" / "manifest.json", out / "data_manifest.json")
    shutil.copy(held_p, out / "held_out_prompts.jsonl")
    print(json.loads((out / "eval.json").read_text())["tau"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
