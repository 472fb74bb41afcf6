"""FP8 targets on the GPU: the two FP8 kernels against bf16 and cuBLAS, and a Qwen3-8B-shaped FP8
target's `ar` step, verify pass and ddtree round against the FP8 floor (issue 23's goals).

1. Kernels, on Qwen3-8B's projection shapes (`skinny_matmul_bench.SHAPES`), each timed as a CUDA graph:
   at T = 1 and 16 rows `fp8_skinny` (block 128 x 128 and per-channel scales) beside the bf16
   `skinny_matmul`, cuBLAS bf16 (`F.linear`) and `torch._scaled_mm` (e4m3, row-wise scales, x already
   quantized); at T = 65 and 257 `fp8_gemm` (its activation quantization included) beside cuBLAS bf16
   and `torch._scaled_mm`. Each time is also given as a fraction of the FP8 weight-read floor
   (N x K bytes at the measured copy bandwidth).
2. The model: `roofline.random_pair` (Qwen3-8B target, 5-layer DFlash drafter, random weights), the
   target's decoder projections quantized (`--fmt`), the embeddings, LM head and drafter in bf16.
   At `--context` it times the `ar` step, `dflash` and `ddtree` B=64 rounds (`roofline.measure_context`,
   whose `floor_ms` is the bf16 one) and the verify pass over 257 nodes, each against its FP8 floor:
   matmul weights at 1 byte, LM head, KV cache and drafter at 2; FLOPs at the measured FP8
   (`torch._scaled_mm`) and bf16 matmul rates. Then the `ar` and ddtree rows projected to the RTX PRO
   6000 by its FP8 floor (datasheet bandwidth and FP8 rate), with tokens/s at tau 3, 5 and 7.

    python benchmarks/fp8_bench.py [--fmt block|channel] [--shape qwen3-8b|qwen3.6-27b] [--context 4096]
        [--skip-kernels] [--skip-model]
    python benchmarks/fp8_bench.py --sweep gemm --shape qwen3.6-27b --rows 65,257,4096    # fp8_gemm tiles
    python benchmarks/fp8_bench.py --sweep skinny --shape qwen3.6-27b    # fp8_skinny's grid at T = 1
    python benchmarks/fp8_bench.py --sweep cublas --shape qwen3.6-27b --rows 17,65,257,4096    # cuBLAS block-scaled

`--shape qwen3.6-27b` takes the hybrid Qwen3.6-27B shapes instead (`roofline.SHAPES`). Several
minutes of GPU time in all.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.roofline import (
    RTX_PRO_6000,
    STORY_SGLANG_MTP,
    Clock,
    measure_context,
    random_pair,
    verify_pass_ms,
)
from benchmarks.roofline import SHAPES as MODEL_SHAPES
from benchmarks.skinny_matmul_bench import SHAPES, SHAPES_27B, graphed_ms
from ddtree_kernels import fp8_cublas
from ddtree_kernels.fp8_gemm import GemmConfig, act_quant, fp8_gemm, gemm_config
from ddtree_kernels.fp8_skinny import default_config as fp8_default_config
from ddtree_kernels.fp8_skinny import fp8_skinny
from ddtree_kernels.host import QuantizedRows, num_sms
from ddtree_kernels.skinny_matmul import SkinnyConfig, skinny_matmul
from ddtree_runtime.engine import Engine
from ddtree_runtime.fp8 import fp8_linear_reference, quantize_weight
from ddtree_runtime.quant import Fp8Linear
from ddtree_runtime.roofline import (
    Ceilings,
    head_elem,
    matmul_params,
    measure_ceilings,
    pass_cost,
    round_floor_s,
)

BLOCKS = {"block": (128, 128), "channel": None}  # None: per-channel, (1, K)
RTX_FP8_RATE = 1000e12  # RTX PRO 6000 Blackwell dense FP8 tensor FLOP/s, from its datasheet (unmeasured here)
PUBLISHED_FP8_DFLASH = 108.0  # tok/s, Qwen3.6-27B FP8 + DFlash on one RTX PRO 6000 (issue 23)
LEFT_IN_BF16 = ("in_proj_a", "in_proj_b")  # the hybrid's small DeltaNet projections, as exports keep them


def quantize_linears(model: nn.Module, fmt: str) -> int:
    """Every linear of the decoder layers (fused or not) as an Fp8Linear in `fmt`, in place; the
    embeddings, LM head and what FP8 exports leave in bf16 stay. Returns the count."""
    names = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name.startswith("layers.") and not name.endswith(LEFT_IN_BF16)
    ]
    # by name, one module at a time: each bf16 weight is freed as its FP8 one lands (a list of the
    # modules would keep all 54 GB of the 27B's alive beside the FP8 copies: too much for 80 GB)
    for name in names:
        module = model.get_submodule(name)
        block = BLOCKS[fmt] or (1, module.in_features)
        weight, scale = quantize_weight(module.weight.detach(), block)
        with torch.device("meta"):
            fp8 = Fp8Linear(module.in_features, module.out_features, block, module.bias is not None)
        fp8.weight = nn.Parameter(weight, requires_grad=False)
        fp8.scale = nn.Parameter(scale, requires_grad=False)
        if module.bias is not None:
            fp8.bias = nn.Parameter(module.bias.detach(), requires_grad=False)
        parent, _, child = name.rpartition(".")
        model.get_submodule(parent).register_module(child, fp8)
    torch.cuda.empty_cache()
    return len(names)


def fp8_matmul_rate(device: torch.device) -> float:
    """FLOP/s of an 8192^3 e4m3 `torch._scaled_mm` (row-wise scales), the FP8 compute ceiling."""
    n = 8192
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
    sa, sb = torch.ones(n, 1, device=device), torch.ones(1, n, device=device)
    ms = do_bench(lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16), return_mode="median")
    return 2 * n**3 / (ms * 1e-3)


def scaled_mm(x8: torch.Tensor, xs: torch.Tensor, w8: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    return torch._scaled_mm(x8, w8.t(), xs, ws.t().contiguous(), out_dtype=torch.bfloat16)


def kernel_rows(ceil: Ceilings) -> list[dict]:
    """Every kernel on every projection shape and row count, in µs and as a fraction of the floor."""
    dev, rows = torch.device("cuda"), []
    for name, (n, k) in SHAPES.items():
        w16 = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k**-0.5 for _ in range(4)]
        quant = {fmt: [quantize_weight(w, block or (1, k)) for w in w16] for fmt, block in BLOCKS.items()}
        for t in (1, 16, 65, 257):
            x = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
            times = {"cublas_bf16": graphed_ms(F.linear, x, w16)}
            if t <= 16:
                times["skinny_bf16"] = graphed_ms(skinny_matmul, x, w16)
            for fmt, block in BLOCKS.items():
                kernel = fp8_skinny if t <= 16 else fp8_gemm
                pairs = quant[fmt]
                times[f"fp8_{fmt}"] = graphed_ms(
                    lambda x, i, kernel=kernel, pairs=pairs, b=block or (1, k): kernel(x, *pairs[i], b),
                    x,
                    list(range(4)),
                )
            padded = F.pad(x, (0, 0, 0, -t % 16))  # cuBLAS's FP8 GEMM wants rows in multiples of 16
            x8, xs = act_quant(padded, k)
            channel = quant["channel"]
            try:
                times["scaled_mm"] = graphed_ms(
                    lambda x8, i, xs=xs, channel=channel: scaled_mm(x8, xs, *channel[i]), x8, list(range(4))
                )
            except RuntimeError as exc:
                times["scaled_mm"] = f"{type(exc).__name__}: {str(exc)[:80]}"
            floor_ms = n * k / ceil.copy_bytes_per_s * 1e3
            row = {"shape": name, "N": n, "K": k, "T": t, "fp8_floor_us": round(floor_ms * 1e3, 1)}
            for key, ms in times.items():
                if isinstance(ms, str):
                    row[f"{key}_us"] = ms
                else:
                    row[f"{key}_us"], row[f"{key}_x_floor"] = round(ms * 1e3, 1), round(ms / floor_ms, 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def skinny_sweep_rows(shapes: dict[str, tuple[int, int]], bw: float) -> list[dict]:
    """`fp8_skinny`'s grid at T = 1 (block 128 x 128): the best configs per shape beside today's
    choice, as a fraction of the copy ceiling (the kernel only streams the e4m3 weight)."""
    dev, rows = torch.device("cuda"), []
    grid = [
        SkinnyConfig(bn, bk, 4, s, sk)
        for bn in (32, 64)
        for bk in (128, 256, 512)
        for s in (3, 4)
        for sk in (1, 2, 4, 8)
    ]
    for name, (n, k) in shapes.items():
        w16 = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k**-0.5 for _ in range(4)]
        pairs = [quantize_weight(w, (128, 128)) for w in w16]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        default = fp8_default_config(n, k, 128, num_sms(dev))
        timed = []
        for cfg in [default, *grid]:
            ms = graphed_ms(
                lambda x, i, cfg=cfg, pairs=pairs: fp8_skinny(x, *pairs[i], (128, 128), cfg),
                x,
                list(range(4)),
            )
            timed.append((ms, cfg))
        default_ms = timed[0][0]
        timed.sort(key=lambda p: p[0])

        def of_copy(ms: float, nbytes: int = n * k) -> float:
            return round(nbytes / (ms * 1e-3) / bw, 2)

        row = {
            "shape": name, "N": n, "K": k,
            "default": [default.block_n, default.block_k, default.num_stages, default.split_k],
            "default_us": round(1e3 * default_ms, 1), "default_of_copy": of_copy(default_ms),
            "best": [[c.block_n, c.block_k, c.num_stages, c.split_k, round(1e3 * ms, 1), of_copy(ms)]
                     for ms, c in timed[:5]],
        }  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def target_weights(
    shapes: dict[str, tuple[int, int]],
) -> Iterator[tuple[str, int, int, list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]]:
    """For each of the target's FP8 projections (the drafter stays bf16): its name, N, K, four bf16
    weights on the GPU (together past the L2) and their 128 x 128-block FP8 quantizations."""
    for name, (n, k) in shapes.items():
        if name.startswith("drafter"):
            continue
        w16 = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(4)]
        yield name, n, k, w16, [quantize_weight(w, (128, 128)) for w in w16]


def sweep_rows(shapes: dict[str, tuple[int, int]], row_counts: tuple[int, ...], bw: float) -> list[dict]:
    """`fp8_gemm`'s tile grid at T rows (block 128 x 128) on the target's FP8 projections (the
    drafter stays bf16), the rows quantized beforehand as their producer does: the best configs
    per shape beside today's choice and cuBLAS bf16, as a fraction of the copy ceiling."""
    dev, rows = torch.device("cuda"), []
    cap, sms = torch.cuda.get_device_capability(dev), num_sms(dev)
    for name, n, k, w16, pairs in target_weights(shapes):
        for t in row_counts:
            default = gemm_config(t, n, k, cap, sms)
            grid = [
                GemmConfig(bm, bn, bk, w, s, sk)
                for bm in sorted({min(128, max(16, 1 << (t - 1).bit_length()))} | ({64} if t > 64 else set()))
                for bn in (64, 128, 256)
                for bk in (128, 256)
                for w in (4, 8)
                for s in (3, 4)
                for sk in (1, 2, 4)
                if (bm + bn) * bk * s <= 200 * 1024
                and bm * bn // (32 * w) <= 128
                and (w == 4 or bm * bn >= 128 * 128)  # 8 warps only for tiles that need the registers
                and k // sk >= bk
                and not (sk > 1 and t > 128)
                and (t <= 512 or (bn >= 128 and bk == 128 and w == 8))  # prefill rows: big tiles only
            ]
            x = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
            q = QuantizedRows(*act_quant(x, 128), 128, x.dtype)
            want = fp8_linear_reference(q, *pairs[0], (128, 128)).float()
            timed = []
            for cfg in [default, *(c for c in grid if c != default)]:

                def call(q, i, cfg=cfg, pairs=pairs):
                    return fp8_gemm(q, *pairs[i], (128, 128), cfg)

                try:
                    err = float((call(q, 0).float() - want).norm() / want.norm())
                    ms = graphed_ms(call, q, list(range(4)))
                except Exception as exc:  # a tile the shared memory or registers cannot hold
                    print(f"  {cfg}: {type(exc).__name__}", flush=True)
                    continue
                timed.append((ms, cfg, err))
            default_ms = timed[0][0]
            timed.sort(key=lambda p: p[0])

            def of_copy(ms: float, nbytes: int = n * k) -> float:
                return round(nbytes / (ms * 1e-3) / bw, 2)

            row = {
                "shape": name, "N": n, "K": k, "T": t, "configs": len(timed),
                "cublas_bf16_us": round(1e3 * graphed_ms(F.linear, x, w16), 1),
                "default": list(default.__dict__.values()), "default_us": round(1e3 * default_ms, 1),
                "default_of_copy": of_copy(default_ms),
                "best": [[*c.__dict__.values(), round(1e3 * ms, 1), of_copy(ms), f"{e:.1e}"]
                         for ms, c, e in timed[:6]],
            }  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def cublas_sweep_rows(
    shapes: dict[str, tuple[int, int]], row_counts: tuple[int, ...], bw: float
) -> list[dict]:
    """`fp8_cublas` (the block-scaled recipe through cuBLAS, padding included) beside `fp8_gemm` and
    cuBLAS bf16 at verify and prefill rows, rows quantized beforehand as their producer does: graphed
    µs, TFLOP/s and the error against the reference."""
    dev, rows = torch.device("cuda"), []
    for name, n, k, w16, pairs in target_weights(shapes):
        for t in row_counts:
            x = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
            q = QuantizedRows(*act_quant(x, 128), 128, x.dtype)
            want = fp8_linear_reference(q, *pairs[0], (128, 128)).float()
            row: dict = {"shape": name, "N": n, "K": k, "T": t}
            calls = {
                "fp8_gemm": lambda q, i, pairs=pairs: fp8_gemm(q, *pairs[i], (128, 128)),
                "fp8_cublas": lambda q, i, pairs=pairs: fp8_cublas.fp8_cublas(q, *pairs[i]),
            }
            for key, call in calls.items():
                try:
                    err = float((call(q, 0).float() - want).norm() / want.norm())
                    ms = graphed_ms(call, q, list(range(4)))
                except RuntimeError as exc:  # a shape cuBLAS refuses
                    row[key] = f"{type(exc).__name__}: {str(exc)[:160]}"
                    continue
                row[key] = [round(1e3 * ms, 1), round(2 * t * n * k / ms / 1e9), f"{err:.1e}"]
            ms = graphed_ms(F.linear, x, w16)
            row["cublas_bf16"] = [round(1e3 * ms, 1), round(2 * t * n * k / ms / 1e9)]
            row["fp8_floor_us"] = round(n * k / bw * 1e6, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def fp8_floor_ms(ceil: Ceilings, fp8_rate: float, cfg, rows: int, context: int) -> float:
    """One target pass over `rows` new rows (`roofline.pass_cost`, dense or hybrid) with its decoder
    matmul weights at 1 byte and their FLOPs at the FP8 rate; LM head, embeddings, KV cache and
    recurrent states as in bf16."""
    nbytes, flops = pass_cost(cfg, rows, context, rows)
    matmul = matmul_params(cfg)
    nbytes -= matmul  # 1 byte per FP8 weight instead of 2
    compute = (flops - 2 * rows * matmul) / ceil.matmul_flops_per_s + 2 * rows * matmul / fp8_rate
    return 1e3 * max(nbytes / ceil.copy_bytes_per_s, compute)


def rtx_projection(rows: list[dict], tcfg, dcfg, context: int, draft_head_elem: int) -> list[dict]:
    """The `ar` step and ddtree rounds scaled to the RTX PRO 6000 by their FP8 floors (each keeps the
    efficiency against its floor that it has on the H200; the sm_120 tiles are not run), with tokens/s
    at tau 3, 5 and 7 beside the story's SGLang MTP and the published FP8 + DFlash figure."""
    out = []
    for r in rows:
        if r["mode"] == "dflash":
            continue
        verified = 1 if r["mode"] == "ar" else r["budget"] + 1
        floor = fp8_floor_ms(RTX_PRO_6000, RTX_FP8_RATE, tcfg, verified, context)
        if r["mode"] != "ar":
            rtx = round_floor_s(RTX_PRO_6000, tcfg, dcfg, r["mode"], r["budget"], context, draft_head_elem)
            floor += 1e3 * rtx["drafter"]
        rtx_ms = r["round_ms"] / r["fp8_floor_ms"] * floor
        taus = (1,) if r["mode"] == "ar" else (3, 5, 7)
        out.append(
            {
                "mode": r["mode"],
                "budget": r["budget"],
                "h200_round_ms": r["round_ms"],
                "rtx_fp8_floor_ms": round(floor, 2),
                "rtx_pro_6000_ms": round(rtx_ms, 2),
                **{f"rtx_tok_s_tau{t}": round(1e3 * t / rtx_ms, 1) for t in taus},
                "story_sglang_mtp_tok_s": STORY_SGLANG_MTP,
                "published_fp8_dflash_tok_s": PUBLISHED_FP8_DFLASH,
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return out


def model_rows(ceil: Ceilings, fp8_rate: float, fmt: str, shape: str, context: int, new_tokens: int) -> dict:
    device = torch.device("cuda")
    target, drafter = random_pair(shape, device, torch.bfloat16, small=False)
    count = quantize_linears(target, fmt)
    weights = sum(t.numel() * t.element_size() for t in target.parameters())
    engine = Engine(target, drafter, context + 1024)
    engine.warmup(["ar", "dflash", "ddtree"], [64], max_prompt=64)
    tcfg = target.config
    rows = measure_context(engine, ceil, context, [64], new_tokens)
    for row in rows:  # the FP8 floors: the target pass over the verified rows, plus the bf16 drafter
        verified = {"ar": 1, "dflash": drafter.config.block_size, "ddtree": (row["budget"] or 0) + 1}
        floor = fp8_floor_ms(ceil, fp8_rate, tcfg, verified[row["mode"]], context)
        if row["mode"] != "ar":
            draft = round_floor_s(
                ceil, tcfg, drafter.config, row["mode"], row["budget"] or 1, context, head_elem(engine)
            )
            floor += 1e3 * draft["drafter"]
        row["fp8_floor_ms"], row["x_fp8_floor"] = round(floor, 3), round(row["round_ms"] / floor, 2)
    verify_ms = verify_pass_ms(engine, Clock(device), context, 257)
    # whether those 257 rows' linears went to cuBLAS (--no-cublas raises its threshold past them)
    cublas_verify = fmt == "block" and fp8_cublas.cublas_takes(device) and fp8_cublas.MIN_ROWS <= 257
    verify_floor = fp8_floor_ms(ceil, fp8_rate, tcfg, 257, context)
    ar = next(r for r in rows if r["mode"] == "ar")
    ddtree = next(r for r in rows if r["mode"] == "ddtree")
    summary = {
        "fmt": fmt,
        "shape": shape,
        "cublas_verify_rows": cublas_verify,
        "fp8_linears": count,
        "target_weight_gib": round(weights / 2**30, 2),
        "context": context,
        "ar_step_ms": ar["round_ms"],
        "ar_x_fp8_floor": ar["x_fp8_floor"],
        "goal_ar": "<= 1.3",
        "verify_257_ms": round(verify_ms, 3),
        "verify_257_fp8_floor_ms": round(verify_floor, 3),
        "verify_257_x_fp8_floor": round(verify_ms / verify_floor, 2),
        "goal_verify": "<= 1.5",
        "ddtree64_round_ms": ddtree["round_ms"],
        "ddtree64_x_ar_step": round(ddtree["round_ms"] / ar["round_ms"], 2),
        "goal_ddtree64": "<= 1.3 x ar",
        "rows": rows,
        "rtx_projection": rtx_projection(rows, tcfg, drafter.config, context, head_elem(engine)),
    }
    print(json.dumps(summary), flush=True)
    return summary


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fmt", choices=list(BLOCKS), default="block")
    p.add_argument("--shape", choices=sorted(MODEL_SHAPES), default="qwen3-8b")
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--skip-kernels", action="store_true")
    p.add_argument("--skip-model", action="store_true")
    p.add_argument(
        "--sweep",
        choices=["gemm", "skinny", "cublas"],
        help="only a tile grid: fp8_gemm at verify rows, fp8_skinny at T=1; or fp8_cublas beside fp8_gemm",
    )
    p.add_argument("--rows", default="65,257,4096", help="row counts of --sweep gemm and cublas")
    p.add_argument("--json", help="write everything here")
    p.add_argument(
        "--no-cublas", action="store_true", help="verify rows on fp8_gemm even where cuBLAS serves"
    )
    args = p.parse_args()
    if args.no_cublas:
        fp8_cublas.MIN_ROWS = sys.maxsize
    device = torch.device("cuda")
    ceil = measure_ceilings(device)
    fp8_rate = fp8_matmul_rate(device)
    print(
        f"{torch.cuda.get_device_name(device)}: copy {ceil.copy_bytes_per_s / 1e12:.2f} TB/s, bf16 matmul "
        f"{ceil.matmul_flops_per_s / 1e12:.0f} TFLOP/s, fp8 matmul {fp8_rate / 1e12:.0f} TFLOP/s",
        flush=True,
    )
    out = {"copy_tb_s": ceil.copy_bytes_per_s / 1e12, "fp8_tflop_s": fp8_rate / 1e12}
    shapes = SHAPES if args.shape == "qwen3-8b" else SHAPES_27B
    rows = tuple(int(t) for t in args.rows.split(","))
    if args.sweep == "gemm":
        out["sweep"] = sweep_rows(shapes, rows, ceil.copy_bytes_per_s)
    elif args.sweep == "cublas":
        out["sweep"] = cublas_sweep_rows(shapes, rows, ceil.copy_bytes_per_s)
    elif args.sweep == "skinny":
        out["sweep"] = skinny_sweep_rows(shapes, ceil.copy_bytes_per_s)
    elif not args.skip_kernels:
        out["kernels"] = kernel_rows(ceil)
    if not args.skip_model and not args.sweep:
        out["model"] = model_rows(ceil, fp8_rate, args.fmt, args.shape, args.context, args.new_tokens)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
