"""``fab tune``'s sweep against an ``ar`` baseline, each sweep stopping once the speedup has clearly
peaked: the DDTree budget on a host that serves our runtime (and vLLM DFlash's
``num_speculative_tokens`` when asked), ``num_speculative_tokens`` of the deployed mode on a host
that serves vLLM or SGLang (run with the deployed settings: tensor parallelism, venv, extra args)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ops.bench.cells import cell_id_for, slug
from ops.bench.matrix import DEFAULT_FOREIGN_PORT, DEFAULT_TEMPLATES, Cell, Server
from ops.bench.prompts import prompt_set_name
from ops.bench.schema import BenchResult
from ops.bench.session import Session


def peaked(speedups: list[float], patience: int, min_gain: float) -> bool:
    """Pure: the last ``patience`` points all sit below the best earlier one by more than ``min_gain``."""
    if len(speedups) <= patience:
        return False
    best = max(speedups[:-patience])
    return all(s < best * (1 - min_gain) for s in speedups[-patience:])


def tune_server(system: str, mode: str, cell: Cell, **settings: Any) -> Server:
    """One point of a sweep: a server with one cell, labelled by its setting."""
    server = Server(label="", system=system, mode=mode, template=DEFAULT_TEMPLATES.get(system), **settings)
    probe = BenchResult(
        system=system,
        mode=mode,
        budget=server.budget,
        num_speculative_tokens=server.num_speculative_tokens,
        prompt_set=prompt_set_name(cell.prompts),
        temperature=cell.temperature,
        concurrency=1,
        output_len=cell.output_len,
    )
    server.label = slug(
        f"tune-{system}-{mode}"
        + (f"-b{server.budget}" if server.budget else "")
        + (f"-k{server.num_speculative_tokens}" if server.num_speculative_tokens else "")
    )
    server.cells = [replace(cell, cell_id="tune-" + cell_id_for(probe))]
    return server


FOREIGN_VARS = ("served_name", "tensor_parallel", "dtype", "max_context", "extra_args", "venv")
DEFAULT_TOKENS = {"dflash": [3, 7, 11, 15]}  # a DFlash drafter drafts up to block_size - 1 (15 for b16)


def tokens_to_sweep(mode: str, tokens: list[int]) -> list[int]:
    """``num_speculative_tokens`` values, ascending: the given ones, else the mode's defaults."""
    return sorted(tokens or DEFAULT_TOKENS.get(mode, [1, 2, 3, 4, 5, 6]))


def tuned_serve(system: str, best: dict[str, Any]) -> dict[str, Any]:
    """The serve settings the best point stands for (what ``tuned_settings`` merges in)."""
    if system == "ddtree":
        return {"mode": "ddtree", "budget": best["budget"]}
    return {"system": system, "mode": best["mode"], "num_speculative_tokens": best["num_speculative_tokens"]}


def sweeps(args: dict[str, Any]) -> list[list[Server]]:
    """Each sweep: its ``ar`` baseline first, then its settings in ascending order."""
    cell = Cell(
        cell_id="",
        prompts=args["prompts"],
        temperature=args["temperature"],
        concurrency=1,
        output_len=args["output_len"],
        num_prompts=args["num_prompts"],
        warmup=args["warmup"],
    )
    serve = args["serve"]
    system = serve.get("system", "ddtree")
    if system != "ddtree":
        settings = {"port": DEFAULT_FOREIGN_PORT, "vars": {k: serve[k] for k in FOREIGN_VARS if k in serve}}
        mode = serve["mode"]
        return [
            [tune_server(system, "ar", cell, **settings)]
            + [
                tune_server(system, mode, cell, num_speculative_tokens=k, **settings)
                for k in tokens_to_sweep(mode, args["tokens"])
            ]
        ]
    out = [
        [tune_server("ddtree", "ar", cell)]
        + [tune_server("ddtree", "ddtree", cell, budget=b) for b in args["budgets"]]
    ]
    if args["vllm_dflash_tokens"]:
        out.append(
            [tune_server("vllm", "ar", cell, port=8100)]
            + [
                tune_server("vllm", "dflash", cell, port=8100, num_speculative_tokens=k)
                for k in args["vllm_dflash_tokens"]
            ]
        )
    return out


def sweep(session: Session, args: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """Measure every sweep's points until its speedup peaks: (one row per point, failures)."""
    plan = sweeps(args)
    session.progress.start(session.host, sum(len(s) for s in plan), 0)
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    for servers in plan:
        base_tps = None
        speedups: list[float] = []
        for server in servers:
            results, failed = session.run_server(server, list(server.cells))
            failures += failed
            if not results:
                continue
            r = results[0]
            if server.mode == "ar":
                base_tps = r.output_throughput
                continue
            speedup = r.output_throughput / base_tps if base_tps and r.output_throughput else 0.0
            speedups.append(speedup)
            rows.append(
                {
                    "system": r.system,
                    "mode": r.mode,
                    "budget": r.budget,
                    "num_speculative_tokens": r.num_speculative_tokens,
                    "tokens_per_s": r.output_throughput,
                    "tau": r.tau,
                    "speedup": speedup,
                    "baseline_tokens_per_s": base_tps,
                }
            )
            if peaked(speedups, args["patience"], args["min_gain"]):
                session.progress.note(session.host, f"speedup peaked; stopping the {server.system} sweep")
                break
    return rows, failures
