"""Speed of the DDTree kernels (issue 6) beside PyTorch SDPA, on one CUDA GPU, in one run.

Qwen3-8B-shaped layer: 32 query heads, 8 KV heads, head_dim 128, bf16, 4096 tokens of context.
Times are medians of CUDA-graph replays (``triton.testing.do_bench_cudagraph``), so launch gaps
stay out; "eager" columns time plain Python launches. Attention rotates over 8 layers' caches
(> L2) and reports per layer. Run: ``python benchmarks/kernels_bench.py [--out DIR] [--sweep]``.

``--tail`` runs only the tail-layout table (issue 22): trees of 17, 65 and 257 nodes at 4K, 16K and
32K context, for Qwen3-8B's attention (32/8 heads, head_dim 128) and Qwen3.6-27B's gated full
attention (24/4 heads, head_dim 256): the planner's pick beside each layout forced (plain,
separate), with the planner's modelled cost of each, to check and fit the cost model of
``tail_layouts``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddtree_kernels.arch import device_row
from ddtree_kernels.host import num_sms
from ddtree_kernels.kv_compact import compact
from ddtree_kernels.marginal_topk import marginal_topk
from ddtree_kernels.tree_attention import (
    TAIL_LAYOUTS,
    AttentionConfig,
    _default_config,
    _plan,
    _tree_attention_kernel,
    tail_layouts,
    tree_attention,
    tree_attention_reference,
    tree_visibility,
)
from ddtree_kernels.tree_build import build_tree, candidate_pairs, tree_from_topk
from ddtree_kernels.tree_walk import node_choices, tree_walk, walk_choices

HQ, HKV, D, LAYERS_ROT = 32, 8, 128, 8
DEV = torch.device("cuda")


def graph_us(fn, reps: int = 1) -> float:
    """Median µs per call of ``fn`` (which runs ``reps`` calls) under CUDA-graph replay."""
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3 / reps


def eager_us(fn, reps: int = 1) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e3 / reps


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (the memory ceiling of this run)."""
    src = torch.randn(512 * 2**20, device=DEV, dtype=torch.bfloat16)  # 1 GiB
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=5, rep=50, return_mode="median")
    return 2 * src.numel() * 2 / (ms * 1e-3)


def random_tree(n: int, gen: torch.Generator) -> torch.Tensor:
    """Best-first-like shape: parents drawn from the earlier nodes, biased to the top of the tree."""
    parents = [-1] + [int(torch.randint(0, max(1, i // 4 + 1), (1,), generator=gen)) for i in range(1, n)]
    return torch.tensor(parents, device=DEV)


def depth_of(parents: torch.Tensor) -> torch.Tensor:
    par = parents.tolist()
    depth = [0] * len(par)
    for i in range(1, len(par)):
        depth[i] = depth[par[i]] + 1
    return torch.tensor(depth, device=DEV)


def make_layer_caches(ctx: int, n: int, hq: int = HQ, hkv: int = HKV, d: int = D):
    s = ctx + n + 8
    k = torch.randn(LAYERS_ROT, hkv, s, d, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(LAYERS_ROT, hkv, s, d, device=DEV, dtype=torch.bfloat16)
    q = torch.randn(hq, n, d, device=DEV, dtype=torch.bfloat16)
    return q, k, v


def attention_case(n: int, ctx: int, gen: torch.Generator, configs=None, with_sdpa=True) -> dict:
    q, k, v = make_layer_caches(ctx, n)
    parents = random_tree(n, gen)
    vis = tree_visibility(parents, depth_of(parents))
    scale = D**-0.5
    row = {"nodes": n, "context": ctx}

    ref = tree_attention_reference(q.float(), k[0].float(), v[0].float(), ctx, parents, scale)
    out = tree_attention(q, k[0], v[0], ctx, vis, scale)
    row["rel_err_tree"] = ((out.float() - ref).norm() / ref.norm()).item()
    ref_c = tree_attention_reference(q.float(), k[0].float(), v[0].float(), ctx, None, scale)
    out_c = tree_attention(q, k[0], v[0], ctx, None, scale)
    row["rel_err_chain"] = ((out_c.float() - ref_c).norm() / ref_c.norm()).item()

    def ours(visibility, cfg=None):
        def run():
            for layer in range(LAYERS_ROT):
                tree_attention(q, k[layer], v[layer], ctx, visibility, scale, cfg)

        return run

    row["tree_us"] = graph_us(ours(vis), LAYERS_ROT)
    row["chain_us"] = graph_us(ours(None), LAYERS_ROT)
    row["tree_eager_us"] = eager_us(ours(vis), LAYERS_ROT)
    if configs:
        best = None
        for cfg in configs:
            try:
                t = graph_us(ours(vis, cfg), LAYERS_ROT)
            except Exception as exc:  # a config the compiler rejects (shared memory) is skipped
                print(f"  config {cfg} failed: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            print(f"  N={n} ctx={ctx} {cfg}: {t:.1f} µs")
            if best is None or t < best[0]:
                best = (t, cfg)
        if best:
            row["best_us"], row["best_config"] = best[0], str(best[1])
    if with_sdpa:
        total = ctx + n
        from ddtree_kernels.tree_attention import ancestors_reference

        tree_mask = ancestors_reference(parents)
        mask = torch.cat([torch.ones(n, ctx, dtype=torch.bool, device=DEV), tree_mask], dim=1)
        qs = q[None]

        def sdpa(masked: bool):
            def run():
                for layer in range(LAYERS_ROT):
                    F.scaled_dot_product_attention(
                        qs,
                        k[layer, None, :, :total],
                        v[layer, None, :, :total],
                        attn_mask=mask if masked else None,
                        scale=scale,
                        enable_gqa=True,
                    )

            return run

        row["sdpa_mask_us"] = graph_us(sdpa(True), LAYERS_ROT)
        row["sdpa_nomask_us"] = graph_us(sdpa(False), LAYERS_ROT)
    flops = 4.0 * HQ * n * (ctx + n) * D
    row["tree_tflops"] = flops / (row["tree_us"] * 1e-6) / 1e12
    row["kv_bytes"] = 2 * HKV * (ctx + n) * D * 2
    return row


# (model, query heads, KV heads, head_dim) of the tail table
TAIL_SHAPES = (("Qwen3-8B", 32, 8, 128), ("Qwen3.6-27B", 24, 4, 256))


def tail_case(
    model: str, hq: int, hkv: int, d: int, n: int, ctx: int, gen: torch.Generator, bw: float
) -> dict:
    """One tree at one context: µs per layer of the planner's pick and of each tail layout forced,
    the planner's modelled cost (key-tile steps) of each, and each one's error against SDPA."""
    q, k, v = make_layer_caches(ctx, n, hq, hkv, d)
    parents = random_tree(n, gen)
    vis = tree_visibility(parents, depth_of(parents))
    scale = d**-0.5
    group = hq // hkv
    base = _default_config(n * group, device_row(DEV, d))
    tail_cfg = AttentionConfig(*device_row(DEV, d).tail)
    keys = ctx + n
    modelled = tail_layouts(n * group, group, keys, hkv, base, num_sms(DEV), tail_cfg, 2)
    picked = _plan(n * group, group, keys, hkv, base, num_sms(DEV), tail_cfg, 2)
    pick = next(name for name, (_, launches) in modelled.items() if launches == picked)
    ref = tree_attention_reference(q.float(), k[0].float(), v[0].float(), ctx, parents, scale)
    row = {
        "model": model,
        "nodes": n,
        "context": ctx,
        "tiles": f"{base.block_m}x{base.block_n}",
        "pick": pick,
    }
    for name, cfg in (("planner", None), *((t, replace(base, tail=t)) for t in TAIL_LAYOUTS)):
        if name != "planner" and name not in modelled:
            continue

        def run(cfg=cfg):
            for layer in range(LAYERS_ROT):
                tree_attention(q, k[layer], v[layer], ctx, vis, scale, cfg)

        out = tree_attention(q, k[0], v[0], ctx, vis, scale, cfg)
        row[f"{name}_rel_err"] = ((out.float() - ref).norm() / ref.norm()).item()
        row[f"{name}_us"] = graph_us(run, LAYERS_ROT)
        if name != "planner":
            launches = modelled[name][1]
            row[f"{name}_model"] = modelled[name][0]
            row[f"{name}_splits"] = "+".join(str(launch.splits) for launch in launches)
    row["kv_read_floor_us"] = 2 * hkv * keys * d * 2 / bw * 1e6
    return row


def _tail_cell(row: dict, name: str) -> str:
    if f"{name}_us" not in row:
        return "-"
    return f"{row[f'{name}_us']:.1f} (model {row[f'{name}_model']:.0f}, splits {row[f'{name}_splits']})"


def tail_summary(rows: list[dict]) -> None:
    print("\n| model | N | context | tiles | pick | planner µs | plain µs | separate µs | KV read µs |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['model']} | {r['nodes']} | {r['context']} | {r['tiles']} | {r['pick']} | {r['planner_us']:.1f} | "
            f"{_tail_cell(r, 'plain')} | {_tail_cell(r, 'separate')} | "
            f"{r['kv_read_floor_us']:.1f} |"
        )
    worst = max((v for r in rows for key, v in r.items() if key.endswith("_rel_err")), default=float("nan"))
    print(f"largest relative error against SDPA (fp32): {worst:.1e}")


def drafter_like_logits(depth: int, vocab: int, peak: float, gen: torch.Generator) -> torch.Tensor:
    """bf16 logits: N(0, 2^2) noise, plus ``peak`` on one token per position (0: a flat draft)."""
    logits = torch.randn(depth, vocab, generator=gen) * 2
    logits[torch.arange(depth), torch.randint(0, vocab, (depth,), generator=gen)] += peak
    return logits.to(DEV, torch.bfloat16)


def tree_build_case(budget: int, depth: int, vocab: int, peak: float, gen: torch.Generator) -> dict:
    logits = drafter_like_logits(depth, vocab, peak, gen)
    root = torch.tensor(1, device=DEV)
    pairs = candidate_pairs(budget, min(budget, vocab), DEV)
    from ddtree_runtime.backend import TorchBackend

    tokens, parents, dep = build_tree(logits, budget, root, pairs)
    h_tokens, h_parents, h_dep = TorchBackend().build_tree(logits, budget, root)
    lp = torch.log_softmax(logits.float(), -1)

    def scores(tok, par, d):
        s = torch.zeros(tok.shape[0], device=DEV, dtype=torch.float64)
        for i in range(1, tok.shape[0]):  # host loop: checking only
            s[i] = s[par[i]] + lp[d[i] - 1, tok[i]]
        return s.sort().values

    ok = torch.allclose(scores(tokens, parents, dep), scores(h_tokens, h_parents, h_dep), atol=1e-3)
    vals, toks = marginal_topk(logits, min(budget, vocab))
    return {
        "budget": budget,
        "depth": depth,
        "vocab": vocab,
        "peak": peak,
        "same_scores_as_heap": bool(ok),
        "tree_depth": int(dep.max()),
        "build_graph_us": graph_us(lambda: build_tree(logits, budget, root, pairs)),
        "marginal_topk_graph_us": graph_us(lambda: marginal_topk(logits, min(budget, vocab))),
        "tree_from_topk_graph_us": graph_us(lambda: tree_from_topk(vals, toks, budget, root, pairs)),
        "torch_log_softmax_topk_graph_us": graph_us(
            lambda: torch.log_softmax(logits.float(), -1).topk(budget, dim=-1)
        ),
        "build_eager_us": eager_us(lambda: build_tree(logits, budget, root, pairs)),
        "heap_torchbackend_us": eager_us(lambda: TorchBackend().build_tree(logits, budget, root)),
    }


def walk_case(n: int, vocab: int, layers: int, ctx: int, gen: torch.Generator) -> dict:
    parents = random_tree(n, gen)
    tokens = torch.randint(0, vocab, (n,), device=DEV, generator=None)
    logits = torch.randn(n, vocab, device=DEV, dtype=torch.bfloat16)
    # the target agrees with the draft on a few edges so that the walk goes deep
    par = parents.tolist()
    for i in range(1, n, 3):
        logits[par[i], tokens[i]] = 30.0
    k = torch.randn(layers, HKV, ctx + n + 8, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    path, path_len, _ = tree_walk(tokens, parents, logits, 0.0, None)

    def walk_and_compact():
        p, pl, _ = tree_walk(tokens, parents, logits, 0.0, None)
        compact(k, v, ctx, p, pl)

    choice = node_choices(logits, 0.0)
    return {
        "nodes": n,
        "vocab": vocab,
        "layers": layers,
        "path_len": int(path_len),
        "walk_plus_compact_graph_us": graph_us(walk_and_compact),
        "choices_only_us": graph_us(lambda: node_choices(logits, 0.0)),
        "walk_only_us": graph_us(lambda: walk_choices(tokens, parents, choice)),
        "compact_only_us": graph_us(lambda: compact(k, v, ctx, path, path_len)),
        "sampled_walk_graph_us": graph_us(lambda: tree_walk(tokens, parents, logits, 0.8, None)),
        "logits_read_floor_us": n * vocab * 2 / 4.0e12 * 1e6,
    }


def sass_excerpt(out_dir: Path) -> dict:
    """Disassemble every compiled variant of the attention kernel; count the matrix instructions."""
    q, k, v = make_layer_caches(4096, 257)
    parents = random_tree(257, torch.Generator().manual_seed(0))
    tree_attention(q, k[0], v[0], 4096, tree_visibility(parents, depth_of(parents)), D**-0.5)
    report, excerpt = [], []
    for entry in _tree_attention_kernel.device_caches.values():
        for key, compiled in entry[0].items():
            cubin = out_dir / "attn.cubin"
            cubin.write_bytes(compiled.asm["cubin"])
            sass = subprocess.run(
                ["cuobjdump", "--dump-sass", str(cubin)], capture_output=True, text=True
            ).stdout
            cubin.unlink()
            counts = {
                op: sass.count(op) for op in ("HGMMA", "HMMA", "LDGSTS", "UTMALDG", "LDG.E.128", "MUFU.EX2")
            }
            report.append(
                {
                    "key": str(key)[-160:],
                    "n_regs": compiled.n_regs,
                    "n_spills": compiled.n_spills,
                    "counts": counts,
                }
            )
            if not excerpt:
                excerpt = [
                    f"variant: {str(key)[-300:]}",
                    f"registers {compiled.n_regs}, spills {compiled.n_spills}",
                    f"counts {counts}",
                    "",
                ]
                excerpt += [ln.strip() for ln in sass.splitlines() if "GMMA" in ln or "HMMA" in ln][:60]
    (out_dir / "tree_attention_sass.txt").write_text(
        "\n".join(excerpt) + "\n\n" + json.dumps(report, indent=1)
    )
    return {"variants": len(report), "first": report[0] if report else None}


def section(result: dict, name: str, fn) -> None:
    """Run one part of the benchmark; a failure is recorded and the rest still runs."""
    try:
        result[name] = fn()
    except Exception as exc:
        result[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    print(name, json.dumps(result[name])[:3000], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--sweep", action="store_true", help="also try launch configurations")
    parser.add_argument("--tail", action="store_true", help="only the tail-layout table (issue 22)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    props = torch.cuda.get_device_properties(DEV)
    result = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    bw = copy_bandwidth()
    result["copy_bw_TBps"] = bw / 1e12
    print(f"{props.name}: copy bandwidth {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    if args.tail:
        section(
            result,
            "tail_layouts",
            lambda: [
                tail_case(model, hq, hkv, d, n, ctx, gen, bw)
                for model, hq, hkv, d in TAIL_SHAPES
                for n in (17, 65, 257)
                for ctx in (4096, 16384, 32768)
            ],
        )
        (args.out / "kernels_bench_tail.json").write_text(json.dumps(result, indent=1))
        if isinstance(result["tail_layouts"], list):
            tail_summary(result["tail_layouts"])
        return

    sweep = {  # beside the planner's choice: the tail in a whole tile, other stage counts and splits
        257: [AttentionConfig(128, 64, 8, 4, None, "plain"), AttentionConfig(128, 64, 8, 3)],
        1025: [AttentionConfig(128, 64, 8, 3)],
        1: [AttentionConfig(16, 128, 4, 3, sp) for sp in (8, 16)],
        256: [],
    }

    def attention_4k():
        # 256 nodes: the same tree budget without the 257th node's tail rows, for comparison
        return [attention_case(n, 4096, gen, sweep[n] if args.sweep else None) for n in (257, 1025, 1, 256)]

    def scaling():
        rows = []
        for ctx in (1024, 4096, 16384, 32768):
            for n in (1, 257):
                row = attention_case(n, ctx, gen, with_sdpa=ctx <= 16384)
                row["kv_read_floor_us"] = row["kv_bytes"] / bw * 1e6
                rows.append(row)
        return rows

    section(result, "attention_4k", attention_4k)
    section(result, "attention_scaling", scaling)
    section(
        result,
        "tree_build",
        lambda: [tree_build_case(b, 15, 151936, peak, gen) for b in (512, 256) for peak in (0.0, 14.0)],
    )
    section(result, "walk", lambda: [walk_case(n, 151936, 36, 4096, gen) for n in (257, 513)])
    section(result, "sass", lambda: sass_excerpt(args.out))
    (args.out / "kernels_bench.json").write_text(json.dumps(result, indent=1))

    summary(result, bw)


def summary(result: dict, bw: float) -> None:
    """The table printed last (the device tool returns the tail of the output)."""
    rows = result["attention_4k"] if isinstance(result["attention_4k"], list) else []
    scaling = result["attention_scaling"] if isinstance(result["attention_scaling"], list) else []
    print("\n| case | ours µs | chain µs | SDPA mask µs | SDPA no mask µs | goal | rel err |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    goals = {257: "≤ 40", 1025: "≤ 130", 1: "≤ {:.1f} (1.3× KV read)"}
    for row in rows:
        n = row["nodes"]
        goal = goals.get(n, "(no goal)").format(1.3 * row["kv_bytes"] / bw * 1e6)
        print(
            f"| attn N={n} ctx=4096 | {row['tree_us']:.1f} | {row['chain_us']:.1f} | {row['sdpa_mask_us']:.1f} | "
            f"{row['sdpa_nomask_us']:.1f} | {goal} | {row['rel_err_tree']:.1e} |"
        )
    for row in scaling:
        print(
            f"| scaling N={row['nodes']} ctx={row['context']} | {row['tree_us']:.1f} | {row['chain_us']:.1f} | "
            f"{row.get('sdpa_mask_us', float('nan')):.1f} | {row.get('sdpa_nomask_us', float('nan')):.1f} | "
            f"KV floor {row['kv_read_floor_us']:.1f} | {row['rel_err_tree']:.1e} |"
        )
    for tb in result["tree_build"] if isinstance(result["tree_build"], list) else []:
        print(
            f"tree build B={tb['budget']} depth {tb['depth']} peak {tb['peak']} (tree depth {tb['tree_depth']}): graph "
            f"{tb['build_graph_us']:.1f} µs = top-k {tb['marginal_topk_graph_us']:.1f} + tree {tb['tree_from_topk_graph_us']:.1f}; "
            f"eager {tb['build_eager_us']:.1f} µs; torch log_softmax+topk {tb['torch_log_softmax_topk_graph_us']:.1f}; heap "
            f"(TorchBackend) {tb['heap_torchbackend_us']:.1f} µs; same scores {tb['same_scores_as_heap']} (goal ≤ 100 µs)"
        )
    for w in result["walk"] if isinstance(result["walk"], list) else []:
        print(
            f"walk+compact N={w['nodes']} 36 layers: {w['walk_plus_compact_graph_us']:.1f} µs (choices "
            f"{w['choices_only_us']:.1f}, walk {w['walk_only_us']:.1f}, compact {w['compact_only_us']:.1f}; "
            f"logits read floor {w['logits_read_floor_us']:.1f}; sampled walk {w['sampled_walk_graph_us']:.1f}) "
            f"path_len {w['path_len']} (goal ≤ 50 µs)"
        )
    print(f"SASS: {result['sass']}")


if __name__ == "__main__":
    main()
