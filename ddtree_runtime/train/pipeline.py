"""The training run as resumable stages: curate → regenerate → extract → train → lint → evaluate.

Everything lives under one run directory, and each stage skips what is already there, so rerunning
the same command after a kill (or with nothing new to do) continues or does nothing:

    data/         prompts.{train,held_out}.jsonl, manifest.json, responses.jsonl
    features/     offline hidden states (index.json + shards), when --extraction offline
    train_state.pt  the training checkpoint (resume point)
    drafter/      the z-lab-format drafter (config.json + model.safetensors)
    lint.json, eval.json, summary.json

Under torchrun, rank 0 prepares the data while the others wait; every rank trains; rank 0 exports,
lints and evaluates.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ddtree_runtime.loader import load_drafter, load_target
from ddtree_runtime.tokenizer import Tokenizer
from ddtree_runtime.train import curate, extract
from ddtree_runtime.train.checkpoint import drafter_config, find_mask_token, new_drafter, save_drafter
from ddtree_runtime.train.evaluate import measure_tau
from ddtree_runtime.train.forward import greedy_batch
from ddtree_runtime.train.trainer import TrainSpec, train

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class RunSpec:
    target: str
    out: str
    prompts: list[str]
    held_out_prompts: list[str] = field(default_factory=list)
    limit: int | None = None
    filters: curate.Filters = field(default_factory=curate.Filters)
    max_prompt_tokens: int = 256
    response_tokens: int = 128
    extraction: str = "online"  # or "offline"
    shard_size: int = 256
    draft_layers: int = 1
    block_size: int = 8
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = None
    train: TrainSpec = field(default_factory=TrainSpec)
    save_dtype: str = "bfloat16"
    eval_prompts: int = 16
    eval_budgets: list[int] = field(default_factory=lambda: [16, 64])
    eval_tokens: int = 64
    device: str = "cpu"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _prompt_ids(tok: Tokenizer | None, text: str, limit: int) -> list[int]:
    if tok is None:
        raise ValueError("the target has no tokenizer.json (fix: copy it next to the target's config.json)")
    return tok.prompt_ids(text)[-limit:]


def prepare(spec: RunSpec, target, tok: Tokenizer | None, layer_ids: tuple[int, ...]) -> None:
    """Rank 0's stages: curation, self-distilled responses, offline features."""
    out, data = Path(spec.out), Path(spec.out) / "data"
    manifest = curate.write_prompt_sets(data, spec.prompts, spec.filters, spec.limit, spec.held_out_prompts)
    log(f"curate: {json.dumps(manifest['counts'])}")
    eos = set(target.config.eos_token_ids)

    def respond(prompts: list[str]) -> list[tuple[list[int], list[int]]]:
        ids = [_prompt_ids(tok, p, spec.max_prompt_tokens) for p in prompts]
        return list(zip(ids, greedy_batch(target, ids, spec.response_tokens, eos), strict=True))

    made = curate.regenerate(
        data / "prompts.train.jsonl",
        data / "responses.jsonl",
        respond,
        progress=lambda done, total: log(f"regenerate {done}/{total}"),
    )
    samples = curate.read_samples(data / "responses.jsonl")
    manifest["responses"] = {
        "rows": len(samples),
        "tokens": sum(len(s) for s, _ in samples),
        "sha256": _sha256(data / "responses.jsonl"),
    }
    extract.write_json(data / "manifest.json", manifest)
    log(f"regenerate: {made} new, {len(samples)} total")
    need = extract.disk_need(
        [len(s) for s, _ in samples], len(layer_ids), target.config.hidden_size, DTYPES[spec.save_dtype]
    )
    log(
        f"extract: {spec.extraction}; stored features would take {extract.human_bytes(need)} "
        f"({extract.human_bytes(need / max(1, manifest['responses']['tokens']))} per token)"
    )
    if spec.extraction == "offline":
        extract.extract_offline(
            target,
            samples,
            layer_ids,
            out / "features",
            spec.shard_size,
            DTYPES[spec.save_dtype],
            progress=lambda done, total: log(f"extract shard {done}/{total}"),
        )


def run(spec: RunSpec) -> dict[str, object]:
    """All stages; returns the summary (also written to `summary.json`)."""
    out = Path(spec.out)
    device = torch.device(spec.device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # NCCL and DDP use the current device
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(hours=12))
    target_dir = Path(spec.target)
    target = load_target(target_dir, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    target.requires_grad_(False)
    tok = Tokenizer(target_dir) if (target_dir / "tokenizer.json").exists() else None
    mask = spec.mask_token_id if spec.mask_token_id is not None else find_mask_token(target_dir)
    raw = drafter_config(target_dir, spec.draft_layers, spec.block_size, mask, spec.target_layer_ids)
    layer_ids = tuple(raw["dflash_config"]["target_layer_ids"])  # type: ignore[index]
    out.mkdir(parents=True, exist_ok=True)
    if _rank() == 0:
        prepare(spec, target, tok, layer_ids)
    if dist.is_initialized():
        dist.barrier()

    drafter_dir = out / "drafter"
    done_path = out / "train_done.json"
    wanted = {"run": asdict(spec), "target_config_sha256": _sha256(target_dir / "config.json")}
    if (
        done_path.exists()
        and json.loads(done_path.read_text()) == wanted
        and (drafter_dir / "model.safetensors").exists()
    ):
        log("train: done already")
    else:
        drafter = new_drafter(target, raw, drafter_dir, spec.train.seed)
        samples = _sample_source(spec, out)
        train(drafter, target, samples, spec.train, out / "train_state.pt")
        if _rank() == 0:
            save_drafter(drafter, raw, drafter_dir, DTYPES[spec.save_dtype])
            extract.write_json(done_path, wanted)
    if dist.is_initialized():
        dist.barrier()
    if _rank() != 0:
        return {}
    summary = {"drafter": str(drafter_dir), "lint": lint_stage(target_dir, drafter_dir, out)}
    summary["eval"] = eval_stage(spec, target, tok, drafter_dir, out)
    extract.write_json(out / "summary.json", summary)
    return summary


def _sample_source(spec: RunSpec, out: Path):
    if spec.extraction == "offline":
        return lambda: extract.read_offline(out / "features")
    samples = curate.read_samples(out / "data" / "responses.jsonl")

    def online() -> Iterator[extract.Sample]:
        for ids, prompt_len in samples:
            yield extract.Sample(torch.tensor(ids, dtype=torch.int64), prompt_len)

    return online


def lint_stage(target_dir: Path, drafter_dir: Path, out: Path) -> dict[str, object]:
    """`specops config lint` against the target; errors stop the run."""
    from drafter_config.findings import format_findings
    from drafter_config.lint import lint

    report = lint(str(drafter_dir), str(target_dir))
    extract.write_json(out / "lint.json", report.as_json())
    if report.errors:
        raise SystemExit(f"lint: the trained drafter does not fit its target:\n{format_findings(report)}")
    log(f"lint: clean ({len(report.findings)} findings, 0 errors)")
    return {"errors": len(report.errors), "findings": len(report.findings)}


def eval_stage(
    spec: RunSpec, target, tok: Tokenizer | None, drafter_dir: Path, out: Path
) -> dict[str, object]:
    """τ on held-out prompts, redone only when the drafter's weights changed."""
    eval_path = out / "eval.json"
    weights = _sha256(drafter_dir / "model.safetensors")
    if eval_path.exists():
        old = json.loads(eval_path.read_text())
        if old.get("drafter_sha256") == weights:
            log(f"eval: done already: {old['tau']}")
            return old
    held = [
        json.loads(line)["prompt"]
        for line in (out / "data" / "prompts.held_out.jsonl").read_text(encoding="utf-8").splitlines()
        if line
    ]
    if not held:
        held = [
            json.loads(line)["prompt"]
            for line in (out / "data" / "prompts.train.jsonl").read_text(encoding="utf-8").splitlines()[-4:]
            if line
        ]
    prompts = [_prompt_ids(tok, p, spec.max_prompt_tokens) for p in held[: spec.eval_prompts]]
    drafter = load_drafter(drafter_dir, target.embed_tokens.weight.device, target.embed_tokens.weight.dtype)
    tau = measure_tau(target, drafter, prompts, spec.eval_budgets, spec.eval_tokens)
    result = {
        "tau": tau,
        "prompts": len(prompts),
        "max_new_tokens": spec.eval_tokens,
        "temperature": 0.0,
        "drafter_sha256": weights,
        "target": spec.target,
    }
    extract.write_json(eval_path, result)
    log(f"eval: tau {json.dumps(tau)}")
    return result
