"""The training run as resumable stages: curate -> cost -> regenerate -> extract -> train -> lint ->
evaluate, for dense and hybrid targets, on one process or a torchrun job over several hosts.

Each host keeps one run directory; each stage skips what is already there, so rerunning the same
command after a kill (or with nothing new to do) continues or does nothing:

    data/              prompts.{train,held_out}.jsonl and manifest.json (every host curates the
                       same prompt files to the same sets; the job checks they agree)
    data/responses/    RANK-of-WORLD.jsonl: each rank's share of the target's own responses
    features/          RANK-of-WORLD/: each rank's offline hidden states (--extraction offline)
    cost.json          the up-front estimate (disk, tokens/s, hours)
    train_state.pt, train_log.jsonl    the checkpoint and the loss curve (the leader's host)
    drafter/, lint.json, eval.json     the trained drafter, its lint and τ (the leader's host)
    summary.json       written last, on every host

Every rank regenerates, extracts and trains on its own shard of the prompts (index modulo the
world size); the leader (`distributed.py`) checkpoints, exports, lints and evaluates.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ddtree_runtime.config import ConfigError
from ddtree_runtime.engine import Engine
from ddtree_runtime.loader import load_drafter, load_target
from ddtree_runtime.models.dflash import DFlashDrafter
from ddtree_runtime.models.target import Target
from ddtree_runtime.tokenizer import Tokenizer
from ddtree_runtime.train import curate, extract
from ddtree_runtime.train.checkpoint import (
    Layout,
    drafter_config,
    find_mask_token,
    init_from,
    new_drafter,
    save_drafter,
)
from ddtree_runtime.train.cost import Cost, regen_tokens_per_s, train_rates
from ddtree_runtime.train.distributed import Job, barrier, from_leader, gather, join
from ddtree_runtime.train.evaluate import measure_tau
from ddtree_runtime.train.forward import TargetFeatures
from ddtree_runtime.train.trainer import BlockLoss, TrainSpec, train

# where a process runs and what it reports, not what it trains: a change keeps a finished run
PLACEMENT = ("device", "leader", "estimate", "eval_prompts", "eval_budgets", "eval_tokens")


class LintFailed(RuntimeError):
    """The trained drafter does not fit its target; the message lists the findings."""


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
    layout: Layout = field(default_factory=Layout)
    mask_token_id: int | None = None
    init_from: str | None = None
    train: TrainSpec = field(default_factory=TrainSpec)
    save_dtype: str = "bfloat16"
    eval_prompts: int = 16
    eval_budgets: list[int] = field(default_factory=lambda: [16, 64])
    eval_tokens: int = 64
    device: str = "cpu"
    leader: bool = False
    estimate: bool = False

    def fingerprint(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in PLACEMENT}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _prompt_ids(tok: Tokenizer | None, text: str, limit: int) -> list[int]:
    if tok is None:
        raise ValueError("the target has no tokenizer.json (fix: copy it next to the target's config.json)")
    return tok.prompt_ids(text)[-limit:]


def _read_prompts(path: Path) -> list[str]:
    return [json.loads(line)["prompt"] for line in path.read_text(encoding="utf-8").splitlines() if line]


def on_leader(job: Job, work: Callable[[], Any]) -> Any:
    """`work()` on the leader; every rank returns its result, or raises the error it raised (so a
    failure there ends every rank with the same message, not a hang at the next collective)."""
    result: Any = None
    error: BaseException | None = None
    if job.is_leader:
        try:
            result = work()
        except (ValueError, RuntimeError, OSError) as e:
            error = e
    result, error = from_leader(job, (result, error))
    if error is not None:
        raise error
    return result


def run(spec: RunSpec) -> dict[str, Any]:
    """All stages; returns the summary on the leader (also written to `summary.json`), {} elsewhere."""
    job = join(spec.device, spec.leader)
    out, target_dir = Path(spec.out), Path(spec.target)
    target = load_target(
        target_dir, job.device, torch.bfloat16 if job.device.type == "cuda" else torch.float32
    )
    target.requires_grad_(False)
    tok = Tokenizer(target_dir) if (target_dir / "tokenizer.json").exists() else None
    if spec.init_from is not None:
        _lint_init(job, spec, target_dir)  # before anything is written
    out.mkdir(parents=True, exist_ok=True)
    if job.host_first:
        manifest = curate.write_prompt_sets(
            out / "data", spec.prompts, spec.filters, spec.limit, spec.held_out_prompts
        )
        if job.is_leader:
            log(f"curate: {json.dumps(manifest['counts'])}")
    barrier(job)
    _check_same_prompts(job, out / "data")

    drafter_dir, done_path = out / "drafter", out / "train_done.json"
    wanted = {"run": spec.fingerprint(), "target_config_sha256": _sha256(target_dir / "config.json")}

    def finished() -> bool:
        return (
            done_path.exists()
            and json.loads(done_path.read_text()) == wanted
            and (drafter_dir / "model.safetensors").exists()
        )

    if on_leader(job, finished):
        if job.is_leader:
            log("train: done already")
    else:
        raw, drafter = _drafter(spec, target, target_dir, job)
        samples = prepare(job, spec, target, tok, drafter, out)
        if samples is None:  # --estimate
            return json.loads((out / "cost.json").read_text()) if job.is_leader else {}
        train(job, drafter, target, samples, spec.train, out)
        if job.is_leader:
            save_drafter(drafter, raw, drafter_dir, getattr(torch, spec.save_dtype))
            extract.write_json(done_path, wanted)

    def finish() -> dict[str, Any]:
        summary = {"drafter": str(drafter_dir), "lint": lint_stage(target_dir, drafter_dir, out)}
        summary["eval"] = eval_stage(spec, target, tok, drafter_dir, out)
        return summary

    summary = on_leader(job, finish)
    if job.host_first:
        extract.write_json(out / "summary.json", summary)
    return summary if job.is_leader else {}


def _drafter(
    spec: RunSpec, target: Target, target_dir: Path, job: Job
) -> tuple[dict[str, Any], DFlashDrafter]:
    """The drafter to train and its config: `--init-from`'s or a new one laid out for the target."""
    if spec.init_from is not None:
        raw, drafter = init_from(Path(spec.init_from), job.device)
        if job.is_leader:
            cfg = drafter.config
            log(
                f"init: {spec.init_from}, block {cfg.block_size}, layers {list(cfg.layer_types)}, "
                f"target layers {list(cfg.target_layer_ids)}"
            )
        return raw, drafter
    mask = spec.mask_token_id if spec.mask_token_id is not None else find_mask_token(target_dir)
    raw = drafter_config(target.config, spec.layout.resolve(target.config), mask)
    return raw, new_drafter(target.config, target_dir, raw, job.device, spec.train.seed)


def _lint_init(job: Job, spec: RunSpec, target_dir: Path) -> None:
    """`--init-from`'s drafter must pass the lint against the target before any work starts."""
    from drafter_config.findings import format_findings

    report = _lint(Path(str(spec.init_from)), target_dir)
    if report.errors:
        raise ConfigError(
            f"--init-from {spec.init_from}: the drafter does not fit the target {target_dir} "
            f"(fix: the findings below, or start a new drafter):\n{format_findings(report)}"
        )
    if job.is_leader:
        log(f"lint (--init-from): clean ({len(report.findings)} findings, 0 errors)")


def _check_same_prompts(job: Job, data: Path) -> None:
    """Every host curated the same prompt sets (same files, same filters), else shards overlap."""
    digests = gather(job, json.loads((data / "manifest.json").read_text())["sha256"])
    if any(d != digests[0] for d in digests):
        bad = sorted({r for r, d in enumerate(digests) if d != digests[job.leader]})
        raise curate.CurationError(
            f"ranks {bad} curated other prompt sets than the leader (fix: the same --prompts files and "
            "filters on every host)"
        )


def _regen_engine(target: Target, spec: RunSpec) -> Engine:
    return Engine(target, None, max_context=spec.max_prompt_tokens + spec.response_tokens + 1)


def prepare(
    job: Job, spec: RunSpec, target: Target, tok: Tokenizer | None, drafter: DFlashDrafter, out: Path
) -> Sequence[extract.Sample] | None:
    """This rank's training samples: the up-front cost, then its share of the target's responses
    and (offline) of the features. None with `--estimate`, after the cost."""
    data = out / "data"
    prompts = _read_prompts(data / "prompts.train.jsonl")
    if len(prompts) < job.world:
        raise curate.CurationError(
            f"{data / 'prompts.train.jsonl'}: {len(prompts)} training prompts for {job.world} ranks "
            "(fix: more prompts, looser filters, or fewer ranks)"
        )
    estimate(job, spec, target, tok, drafter, prompts, out)
    if spec.estimate:
        return None
    engine = _regen_engine(target, spec)

    def respond(batch: list[str]) -> list[tuple[list[int], list[int]]]:
        pairs = []
        for text in batch:
            ids = _prompt_ids(tok, text, spec.max_prompt_tokens)
            pairs.append(
                (ids, engine.generate(ids, mode="ar", max_new_tokens=spec.response_tokens).output_ids)
            )
        return pairs

    def progress(stage: str) -> Callable[[int, int], None]:
        def report(done: int, total: int) -> None:
            if job.is_leader:  # one rank's progress stands for all: they run in step
                log(f"{stage} {done}/{total} (rank {job.rank})")

        return report

    name = f"{job.rank:05d}-of-{job.world:05d}"
    responses = data / "responses" / f"{name}.jsonl"
    responses.parent.mkdir(exist_ok=True)
    made = curate.regenerate(
        data / "prompts.train.jsonl",
        responses,
        respond,
        progress=progress("regenerate"),
        shard=(job.rank, job.world),
    )
    rows = curate.read_samples(responses)
    counts = gather(job, (made, len(rows), sum(len(s) for s, _ in rows)))
    if job.is_leader:
        new, total, tokens = (sum(c[i] for c in counts) for i in range(3))
        manifest = json.loads((data / "manifest.json").read_text())
        manifest["responses"] = {"rows": total, "tokens": tokens}
        extract.write_json(data / "manifest.json", manifest)
        log(f"regenerate: {new} new, {total} total over {job.world} rank(s)")
    if spec.extraction == "offline":
        folder = out / "features" / name
        extract.extract_offline(
            target,
            rows,
            drafter.config.target_layer_ids,
            folder,
            spec.shard_size,
            getattr(torch, spec.save_dtype),
            progress=progress("extract shard"),
            sharing=job.local_world,
        )
        return extract.OfflineSamples(folder)
    return [extract.Sample(torch.tensor(ids, dtype=torch.int64), plen) for ids, plen in rows]


def estimate(
    job: Job,
    spec: RunSpec,
    target: Target,
    tok: Tokenizer | None,
    drafter: DFlashDrafter,
    prompts: list[str],
    out: Path,
) -> Cost:
    """The run's cost from a short warm-up on every rank, printed and written (`cost.json`) by the
    leader before any long stage starts."""
    ids = [_prompt_ids(tok, p, spec.max_prompt_tokens) for p in prompts[:1000]]
    prompt_len = sum(len(i) for i in ids) / len(ids)
    length = round(prompt_len) + spec.response_tokens
    regen = regen_tokens_per_s(_regen_engine(target, spec), ids[0], min(32, spec.response_tokens))
    layer_ids = drafter.config.target_layer_ids
    features, draft = train_rates(
        BlockLoss(drafter, target, spec.train.loss_gamma),
        TargetFeatures(target, layer_ids),
        spec.train,
        round(prompt_len),
        length,
        target.config.vocab_size,
    )
    cfg, t = target.config, spec.train
    cost = Cost(
        samples=len(prompts),
        prompt_tokens=prompt_len,
        response_tokens=spec.response_tokens,
        ranks=job.world,
        regen_tokens_per_s=regen * job.world,
        features_tokens_per_s=features * job.world,
        drafter_tokens_per_s=draft * job.world,
        features_bytes=extract.disk_need(
            [length] * len(prompts), len(layer_ids), cfg.hidden_size, getattr(torch, spec.save_dtype)
        ),
        steps=t.steps,
        step_tokens=t.micro_batch * t.grad_accum * job.world * length,
    )
    if job.is_leader:
        offline = spec.extraction == "offline"
        for line in cost.lines(offline):
            log(line)
        extract.write_json(out / "cost.json", cost.as_json(offline))
    return cost


def _lint(drafter_dir: Path, target_dir: Path):
    from drafter_config.lint import lint

    return lint(str(drafter_dir), str(target_dir))


def lint_stage(target_dir: Path, drafter_dir: Path, out: Path) -> dict[str, object]:
    """`specops config lint` against the target; errors stop the run."""
    from drafter_config.findings import format_findings

    report = _lint(drafter_dir, target_dir)
    extract.write_json(out / "lint.json", report.as_json())
    if report.errors:
        raise LintFailed(f"lint: the trained drafter does not fit its target:\n{format_findings(report)}")
    log(f"lint: clean ({len(report.findings)} findings, 0 errors)")
    return {"errors": len(report.errors), "findings": len(report.findings)}


def eval_stage(
    spec: RunSpec, target: Target, tok: Tokenizer | None, drafter_dir: Path, out: Path
) -> dict[str, object]:
    """τ on held-out prompts, redone only when the drafter's weights changed."""
    eval_path = out / "eval.json"
    weights = _sha256(drafter_dir / "model.safetensors")
    if eval_path.exists():
        old = json.loads(eval_path.read_text())
        if old.get("drafter_sha256") == weights:
            log(f"eval: done already: {old['tau']}")
            return old
    held = _read_prompts(out / "data" / "prompts.held_out.jsonl")
    if not held:
        held = _read_prompts(out / "data" / "prompts.train.jsonl")[-4:]
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
