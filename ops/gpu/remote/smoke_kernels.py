"""Smoke test: each specops kernel runs once on the host's GPU against its PyTorch reference.

Runs before anything is deployed, so the kernels arrive with the script: the controller puts a
line ``SOURCES = {...}`` (file name -> source of its ``ddtree_kernels/*.py``) in front of this file, and
they are written to a temporary package first (``@triton.jit`` reads its function's source file).
Small shapes, but the attention cases reach every tile choice of the device's row in
``ddtree_kernels/arch.py`` (decode, small, large and the separate tail launch). Prints one JSON object:
``{"skipped": why}`` without a CUDA device (unless TRITON_INTERPRET=1), else the device, its
row and one entry per kernel: name, config, max error and tolerance, or the error. The FP8 cases
run where the GPU has FP8 tensor cores (sm_89 and newer), cuBLAS's block-scaled one on Hopper.
"""

import json
import os
import sys
import tempfile

SOURCES = globals().get("SOURCES", {})


def _error(exc):
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:2000]


# (name, nodes, tree?, tail layout: None for the planner's) at 8/2 heads (GQA group 4, as Qwen3-8B),
# head_dim 128: 4, 68, 260 (whole large tiles and a 4-row tail, in a tile of its own or apart) and 256
# packed rows reach every tile choice of the row, whichever tail layout the planner would pick
ATTENTION_CASES = [
    ("attention decode", 1, False, None),
    ("attention tree small", 17, True, None),
    ("attention tree large + plain tail", 65, True, "plain"),
    ("attention tree large + separate tail", 65, True, "separate"),
    ("attention chain", 64, False, None),
]


def run_attention(entry, k, torch, device, row, nodes, tree, tail):
    """The planner's launches for this shape (recorded first), and the relative error against SDPA."""
    ta = k["tree_attention"]
    gen = torch.Generator().manual_seed(nodes)
    hq, hkv, d, ctx = 8, 2, 128, 300
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q = torch.randn(hq, nodes, d, generator=gen).to(device, dtype)
    k_cache = torch.randn(hkv, ctx + nodes, d, generator=gen).to(device, dtype)
    v_cache = torch.randn(hkv, ctx + nodes, d, generator=gen).to(device, dtype)
    parents = None
    vis = None
    if tree:
        parents = torch.tensor(
            [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, nodes)], device=device
        )
        depth = ta.ancestors_reference(parents).sum(1) - 1
        vis = ta.tree_visibility(parents, depth)
    rows = nodes * hq // hkv
    cfg = ta._default_config(rows, row)
    cfg = ta.AttentionConfig(cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, tail=tail)
    sms, tail_cfg = k["host"].num_sms(device), ta.AttentionConfig(*row.tail)
    launches = ta._plan(rows, hq // hkv, ctx + nodes, hkv, cfg, sms, tail_cfg, k_cache.element_size())
    entry["config"] = " + ".join(
        f"{launch.config.block_m}x{launch.config.block_n} w{launch.config.num_warps} "
        f"s{launch.config.num_stages} splits {launch.splits}"
        for launch in launches
    )
    out = ta.tree_attention(q, k_cache, v_cache, ctx, vis, 0.088, cfg)
    ref = ta.tree_attention_reference(q, k_cache, v_cache, ctx, parents, 0.088)
    err = float(((out.float() - ref.float()).norm() / ref.float().norm()).item())
    entry["max_error"], entry["tolerance"] = err, 2e-2 if dtype == torch.bfloat16 else 1e-4


def run_topk(entry, k, torch, device):
    entry["config"] = "k=64 of 15 x 5000"
    logits = torch.randn(15, 5000, generator=torch.Generator().manual_seed(1)).to(device)
    vals, toks = k["marginal_topk"].marginal_topk(logits, 64)
    want_vals, want_toks = k["marginal_topk"].marginal_topk_reference(logits, 64)
    err = (
        float((vals.cpu() - want_vals.cpu()).abs().max()) if torch.equal(toks.cpu(), want_toks.cpu()) else 1.0
    )
    entry["max_error"], entry["tolerance"] = err, 2e-5


def run_tree_build(entry, k, torch, device):
    entry["config"] = "budget 40 of 3 x 12"
    tb = k["tree_build"]
    logits = torch.randn(3, 12, generator=torch.Generator().manual_seed(2)) * 3
    tokens, parents, _ = tb.build_tree(logits.to(device), 40, torch.tensor(7, device=device))
    want_tokens, want_parents, _ = tb.build_tree_reference(logits, 40, 7)

    def prefixes(tok, par):
        found = set()
        for i in range(1, len(tok)):
            path, j = [], i
            while j > 0:
                path.append(tok[j])
                j = par[j]
            found.add(tuple(reversed(path)))
        return found

    same = prefixes(tokens.tolist(), parents.tolist()) == prefixes(want_tokens, want_parents)
    entry["max_error"], entry["tolerance"] = 0.0 if same else 1.0, 0.0


def run_walk(entry, k, torch, device):
    tw = k["tree_walk"]
    gen = torch.Generator().manual_seed(3)
    n, vocab = 33, 3000
    entry["config"] = f"greedy, {n} nodes x {vocab}"
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)])
    tokens = torch.randint(0, vocab, (n,), generator=gen)
    logits = torch.randn(n, vocab, generator=gen)
    for i in range(1, n):  # the target agrees with most of the draft
        logits[parents[i], tokens[i]] += 8.0
    path, path_len, bonus = tw.tree_walk(tokens.to(device), parents.to(device), logits.to(device), 0.0)
    want_path, want_bonus = tw.tree_walk_reference(tokens, parents, logits.argmax(-1))
    same = path.tolist()[: int(path_len)] == want_path and int(bonus) == want_bonus
    entry["max_error"], entry["tolerance"] = 0.0 if same else 1.0, 0.0


def run_compact(entry, k, torch, device):
    gen = torch.Generator().manual_seed(4)
    cache = torch.randn(2, 2, 80, 128, generator=gen)
    ctx, path = 40, [0, 3, 7, 20]
    entry["config"] = f"{len(path)} rows, 2 layers"
    k_cache, v_cache = cache.clone().to(device), (cache * 2).to(device)
    k["kv_compact"].compact(
        k_cache, v_cache, ctx, torch.tensor(path, device=device), torch.tensor(len(path), device=device)
    )
    k_ref, v_ref = cache.clone(), cache * 2
    k["kv_compact"].compact_reference(k_ref, v_ref, ctx, path)
    err = max(float((k_cache.cpu() - k_ref).abs().max()), float((v_cache.cpu() - v_ref).abs().max()))
    entry["max_error"], entry["tolerance"] = err, 0.0


def _gdn_inputs(torch, device, n, hk=2, hv=4, d=32):
    """q, k [n, hk, d] (unit rows, q scaled), v [n, hv, d], g, beta [n, hv] and a state [hv, d, d]."""
    gen = torch.Generator().manual_seed(n)
    q = torch.nn.functional.normalize(torch.randn(n, hk, d, generator=gen), dim=-1) * d**-0.5
    k = torch.nn.functional.normalize(torch.randn(n, hk, d, generator=gen), dim=-1)
    v = torch.randn(n, hv, d, generator=gen)
    g, beta = -torch.rand(n, hv, generator=gen), torch.rand(n, hv, generator=gen)
    state = torch.randn(hv, d, d, generator=gen) * 0.3
    return [x.to(device) for x in (q, k, v, g, beta, state)]


def run_gdn_tree(entry, k, torch, device):
    """A Gated DeltaNet verify of a 65-node tree (a budget of 64: the node blocks and the lone last
    node as the solve's tail), then the commit along one path."""
    gt = k["gdn_tree"]
    n = 65
    gen = torch.Generator().manual_seed(5)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) // 2 for i in range(1, n)]
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    q, kk, v, g, beta, state = _gdn_inputs(torch, device, n)
    plan = gt.tree_plan(torch.tensor(parents, device=device), torch.tensor(depth, device=device), 4)
    entry["config"] = f"{n} nodes, {plan.block}-node blocks"
    o, d, gsum = gt.gdn_tree(q, kk, v, g, beta, state, plan)
    want = gt.gdn_tree_reference(q, kk, v, g, beta, parents, state)
    err = max(float((x.float() - y.float()).abs().max()) for x, y in zip((o, d, gsum), want, strict=True))
    path = [max(range(n), key=depth.__getitem__)]
    while parents[path[0]] >= 0:
        path.insert(0, parents[path[0]])
    states = state[None].clone()
    convs = torch.zeros(1, 3, 8, device=device)
    padded = torch.tensor(path + [-1] * (n - len(path)), device=device)
    k["gdn_commit"].gdn_commit(
        states, convs, kk[None], d[None], gsum[None], torch.zeros(1, n, 8, device=device),
        plan.windows, padded, torch.tensor(len(path), device=device),
    )  # fmt: skip
    g_last = gsum[:, path[-1]]  # the state along the path, from the reference's corrections
    w = (g_last[:, None] - gsum[:, path]).exp()  # [hv, len]
    rep = v.shape[1] // kk.shape[1]
    k_path = kk[path].repeat_interleave(rep, dim=1).transpose(0, 1)  # [hv, len, d]
    want_state = g_last.exp()[:, None, None] * state + (k_path * w[..., None]).transpose(1, 2) @ d[:, path]
    err = max(err, float((states[0] - want_state).abs().max()))
    entry["max_error"], entry["tolerance"] = err, 1e-2 if device.type == "cuda" else 2e-5


def run_gdn_step(entry, k, torch, device):
    """One `ar` token through the fused recurrence and output norm, against a one-node tree."""
    entry["config"] = "1 token, 4 value heads"
    q, kk, v, g, beta, state = _gdn_inputs(torch, device, 1)
    hv, d = v.shape[1], v.shape[2]
    z = torch.randn(1, hv * d, generator=torch.Generator().manual_seed(6)).to(device)
    w = torch.ones(d, device=device)
    o_ref = k["gdn_tree"].gdn_tree_reference(q, kk, v, g, beta, [-1], state)[0]  # [1, hv, d]
    normed = o_ref * torch.rsqrt(o_ref.pow(2).mean(-1, keepdim=True) + 1e-6)
    want = (normed.reshape(1, -1) * torch.nn.functional.silu(z)).float()
    out = k["gdn_step"].gdn_step(q, kk, v, g, beta, state.clone(), z, 0, w, 1e-6)
    entry["max_error"], entry["tolerance"] = float((out.float() - want).abs().max()), 1e-3


# (name, rows, per-channel?): the skinny kernel (<= 16 rows) and the GEMM, on both FP8 formats
FP8_CASES = [
    ("fp8 skinny block", 4, False),
    ("fp8 skinny per-channel", 4, True),
    ("fp8 gemm block", 40, False),
    ("fp8 gemm per-channel", 40, True),
    ("fp8 gemm tree", 65, False),  # a B=64 tree: two row tiles, the second of one row
]


def run_fp8(entry, k, torch, device, rows, per_channel, cublas=False):
    """An FP8 target's linear against the dequantized reference (128 x 128 blocks, or per channel);
    `cublas`: through cuBLAS's block-scaled GEMM, which big trees and prefills take on Hopper."""
    g, ref = k["fp8_gemm"], k["fp8_reference"]
    gen = torch.Generator().manual_seed(rows)
    n, cols = 384, 512
    block = (1, cols) if per_channel else (128, 128)
    weight, scale = ref.quantize_weight(torch.randn(n, cols, generator=gen) * cols**-0.5, block)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    x = torch.randn(rows, cols, generator=gen).to(dtype)
    entry["config"] = f"{rows} x {cols} by {n}, block {block[0]}x{block[1]}"
    x_d, weight_d, scale_d = x.to(device), weight.to(device), scale.to(device)
    if cublas:
        out = k["fp8_cublas"].fp8_cublas(x_d, weight_d, scale_d)
    else:
        run = k["fp8_skinny"].fp8_skinny if rows <= 16 else g.fp8_gemm
        out = run(x_d, weight_d, scale_d, block)
    want = ref.fp8_linear_reference(x.float(), weight, scale, block)
    err = float(((out.float().cpu() - want).norm() / want.norm()).item())
    entry["max_error"], entry["tolerance"] = err, 2e-2 if dtype == torch.bfloat16 else 1e-5


def run_fp8_producer(entry, k, torch, device, producer):
    """RMSNorm or SwiGLU writing its output quantized, in both scale layouts (per 128-column group,
    per row): the e4m3 values and scales of the unfused kernel's output quantized by the reference,
    bit for bit (an error of 1 for any difference)."""
    gen = torch.Generator().manual_seed(7)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cols = 640
    x = (torch.randn(3, 2 * cols if producer == "silu_mul" else cols, generator=gen) * 3).to(device, dtype)
    w = torch.ones(cols, device=device, dtype=dtype)
    entry["config"] = f"3 x {cols}, groups of 128 and per row"
    err = 0.0
    for group in (128, cols):
        if producer == "silu_mul":
            out, rows = k["silu_mul"].silu_mul(x), k["silu_mul"].silu_mul_fp8(x, group)
        else:
            out, _, rows = k["rms_norm"].rms_norm_fp8(x, w, 1e-6, None, group)
        q, s = k["fp8_reference"].act_quant_reference(out.cpu(), group)
        same = torch.equal(rows.x8.cpu().view(torch.uint8), q.view(torch.uint8)) and torch.equal(
            rows.scale.cpu(), s
        )
        err = max(err, 0.0 if same else 1.0)
    entry["max_error"], entry["tolerance"] = err, 0.0


def main():
    result = {"torch": None, "triton": None}
    try:
        import torch
        import triton
    except ImportError as exc:
        print(json.dumps({**result, "skipped": f"torch/triton not importable in this venv ({_error(exc)})"}))
        return
    result.update(torch=torch.__version__, triton=triton.__version__)
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if not interpret and not torch.cuda.is_available():
        print(
            json.dumps(
                {
                    **result,
                    "skipped": f"no CUDA device visible to torch {torch.__version__} "
                    f"(CUDA build: {torch.version.cuda or 'none, CPU-only'})",
                }
            )
        )
        return
    device = torch.device("cpu" if interpret else "cuda:0")
    if interpret:
        result.update(device="cpu (TRITON_INTERPRET=1)", capability=None, smem_optin=None)
    else:
        props = torch.cuda.get_device_properties(device)
        result.update(
            device=props.name,
            capability=[props.major, props.minor],
            smem_optin=props.shared_memory_per_block_optin,
        )
    with tempfile.TemporaryDirectory(prefix="specops-kernels-") as tmp:
        result.update(run_kernels(import_kernels(tmp), torch, device))
    print(json.dumps(result))


def import_kernels(tmp):
    """This checkout's kernels package, written under ``tmp`` and imported ahead of any installed one."""
    import importlib

    os.makedirs(os.path.join(tmp, "ddtree_kernels"))
    for name, text in SOURCES.items():
        with open(os.path.join(tmp, "ddtree_kernels", name), "w") as f:
            f.write(text)
    sys.path.insert(0, tmp)
    return {
        name: importlib.import_module(f"ddtree_kernels.{name}")
        for name in (
            "arch",
            "host",
            "tree_attention",
            "marginal_topk",
            "tree_build",
            "tree_walk",
            "kv_compact",
            "gdn_tree",
            "gdn_commit",
            "gdn_step",
            "fp8_gemm",
            "fp8_skinny",
            "fp8_cublas",
            "fp8_reference",
            "rms_norm",
            "silu_mul",
        )
    }


def run_kernels(k, torch, device):
    """The device's row, then each case: its config, and its error against the reference or its exception."""
    try:
        row = k["arch"].device_row(device)
    except RuntimeError as exc:
        return {"row": None, "row_error": _error(exc), "kernels": []}
    cases = [
        (name, lambda e, n=nodes, t=tree, tl=tail: run_attention(e, k, torch, device, row, n, t, tl))
        for name, nodes, tree, tail in ATTENTION_CASES
    ]
    cases += [
        (name, lambda e, f=fn: f(e, k, torch, device))
        for name, fn in (
            ("marginal_topk", run_topk),
            ("tree_build", run_tree_build),
            ("tree_walk", run_walk),
            ("kv_compact", run_compact),
            ("gdn_tree + commit", run_gdn_tree),
            ("gdn_step", run_gdn_step),
        )
    ]
    if device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 9):  # FP8 tensor cores
        cases += [
            (name, lambda e, r=rows, c=per_channel: run_fp8(e, k, torch, device, r, c))
            for name, rows, per_channel in FP8_CASES
        ]
        cases += [
            (f"fp8 {p} + quantize", lambda e, p=p: run_fp8_producer(e, k, torch, device, p))
            for p in ("rms_norm", "silu_mul")
        ]
    if k["fp8_cublas"].cublas_takes(device):  # a Hopper GPU: a 257-node tree's rows (padded to 272)
        cases.append(("fp8 cublas block", lambda e: run_fp8(e, k, torch, device, 257, False, cublas=True)))
    kernels = []
    for name, run in cases:
        entry = {"name": name}
        try:
            run(entry)
            if device.type == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:
            entry["error"] = _error(exc)
        kernels.append(entry)
    return {"row": row.describe(), "kernels": kernels}


main()
