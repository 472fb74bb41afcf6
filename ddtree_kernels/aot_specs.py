"""The launch of every kernel, as the ``Spec`` that ``ddtree_kernels/aot.py`` compiles for each target.

**This module is the one place that mirrors the launch wrappers.** Each ``Spec`` names a kernel's
arguments with sample values (meta tensors: no memory) at the real model shapes (Qwen3-8B: 32/8
heads, head_dim 128, vocabulary 151936, DFlash block 16, tree budgets up to 1024) and is
specialised exactly as ``@triton.jit`` would at launch (ints equal to 1 become constants, 16-byte
multiples get divisibility hints: without them the compiler spills where the real launch does
not). When a wrapper's launch changes (arguments, constexprs, warps), change its builder here; the
tree build, top-k and tree walk kernels take their constexprs and warps from their own modules'
``*_launch`` functions, which their wrappers launch with.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from ddtree_kernels import (
    attention_gate,
    fp8_gemm,
    fp8_skinny,
    gated_rms_norm,
    gdn_commit,
    gdn_inputs,
    gdn_step,
    gdn_tree,
    kv_compact,
    marginal_topk,
    qk_rope,
    rms_norm,
    silu_mul,
    skinny_matmul,
    split_k,
    tree_attention,
    tree_build,
    tree_walk,
)
from ddtree_kernels.aot import TARGETS, Spec
from ddtree_kernels.arch import ROWS, WIDE_ROWS, ArchRow, Tiles
from ddtree_kernels.host import cdiv, next_pow2

# Qwen3-8B with its DFlash drafter (block 16) and the largest tree budget
HQ, HKV, HEAD_DIM, VOCAB, LAYERS = 32, 8, 128, 151936, 36
DRAFT_POSITIONS, BUDGET, CONTEXT = 15, 1024, 4096
SMS = {80: 108, 90: 132, 100: 148, 120: 188}  # H100/H200, B200, RTX PRO 6000 multiprocessors
PDL = True  # every target is sm_90 or newer, where the launches use PDL (ddtree_kernels/pdl.py)
META = torch.device("meta")


def _empty(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device=META)


def _strides(names: str, tensor: torch.Tensor) -> dict[str, int]:
    return dict(zip(names.split(), tensor.stride(), strict=False))


# --- tree attention (ddtree_kernels/tree_attention.py) -------------------------------------------------


def _attention(
    case: str,
    row: ArchRow,
    cc: int,
    tiles: Tiles,
    nodes: int,
    row0: int,
    tree: bool,
    split: bool,
    head_dim: int = HEAD_DIM,
) -> Spec:
    """One ``_tree_attention_kernel`` launch over packed rows [row0, nodes * G) of a Qwen3-8B layer
    (with ``head_dim`` 256: the shape of a Qwen3.6 gated full-attention layer's heads)."""
    q = _empty(HQ, nodes, head_dim, dtype=torch.bfloat16)
    cache_rows = CONTEXT + BUDGET + 1
    k_cache = _empty(1, HKV, cache_rows, head_dim, dtype=torch.bfloat16)
    desc = TensorDescriptor(
        k_cache, list(k_cache.shape), list(k_cache.stride()), [1, 1, tiles.block_n, head_dim]
    )
    node0 = row0 // (HQ // HKV)
    part = _empty(4, HQ, nodes - node0, head_dim) if split else q
    part_ml = _empty(4, HQ, nodes - node0, 2) if split else q
    bits = _empty(nodes, cdiv(nodes, 32), dtype=torch.int32) if tree else q
    args = dict(
        Q=q,
        K=desc,
        V=desc,
        BITS=bits,
        OUT=q,
        PART_ACC=part,
        PART_ML=part_ml,
        SLOTS=None,
        ROWS=None,
        stride_qz=0,
        **_strides("stride_qh stride_qn stride_qd", q),
        stride_oz=0,
        **_strides("stride_oh stride_on stride_od", q),
        stride_bz=0,
        stride_bn=bits.stride(0),
        **_strides("stride_ps stride_ph stride_pn", part),
        stride_pz=0,
        n_nodes=nodes,
        row0=row0,
        part_node0=node0,
        CTX=_empty((), dtype=torch.int64),
        qk_scale=0.127,
        kv_heads=HKV,
    )
    constexprs = dict(
        GROUP=HQ // HKV,
        HEAD_DIM=head_dim,
        D_PAD=head_dim,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        TREE=tree,
        ALL=False,
        WINDOW=0,
        SPLIT=split,
        PRECISION=0,
        PDL=cc >= 90,  # the generic row's sm_80 has no griddepcontrol
    )
    return Spec(
        "tree_attention",
        f"{case} {tiles.block_m}x{tiles.block_n} w{tiles.num_warps} s{tiles.num_stages}",
        cc,
        tree_attention._tree_attention_kernel,
        args,
        constexprs,
        tiles.num_warps,
        tiles.num_stages,
        row=row.family,
        limit=row.smem_per_block,
    )


def attention_specs(row: ArchRow, cc: int, head_dim: int = HEAD_DIM) -> list[Spec]:
    """Every config the planner can choose from ``row``, at the shapes that choose it."""
    group = HQ // HKV
    tail_row0 = ((BUDGET // 4 + 1) * group // row.large.block_m) * row.large.block_m
    return [
        _attention("decode N=1", row, cc, row.decode, 1, 0, tree=False, split=True, head_dim=head_dim),
        _attention("tree B=16 N=17", row, cc, row.small, 17, 0, tree=True, split=True, head_dim=head_dim),
        _attention(
            "tree B=256 N=257 main",
            row,
            cc,
            row.large,
            BUDGET // 4 + 1,
            0,
            tree=True,
            split=True,
            head_dim=head_dim,
        ),
        _attention(
            "tree B=256 N=257 tail",
            row,
            cc,
            row.tail,
            BUDGET // 4 + 1,
            tail_row0,
            tree=True,
            split=True,
            head_dim=head_dim,
        ),
        _attention(
            "tree B=1024 N=1025", row, cc, row.large, BUDGET + 1, 0, tree=True, split=False, head_dim=head_dim
        ),
        _attention(
            "chain prefill N=512", row, cc, row.large, 512, 0, tree=False, split=False, head_dim=head_dim
        ),
        _drafter_attention(row, cc, head_dim),
        *([_drafter_attention(row, cc, head_dim, window=2048)] if head_dim == HEAD_DIM else []),
        *(parts_specs(row, cc) if head_dim == HEAD_DIM else []),
    ]


def _drafter_attention(row: ArchRow, cc: int, head_dim: int, window: int = 0) -> Spec:
    """The DFlash drafter's block of 16 queries, each seeing the context and the whole block (a
    sliding layer: within ``window`` positions, as the Qwen3.6-27B drafter's 2048)."""
    spec = _attention(
        f"drafter block N=16{' window 2048' if window else ''}",
        row,
        cc,
        row.small,
        16,
        0,
        tree=False,
        split=True,
        head_dim=head_dim,
    )
    return replace(spec, constexprs={**spec.constexprs, "ALL": True, "WINDOW": window})


def parts_specs(row: ArchRow, cc: int) -> list[Spec]:
    """``tree_attention_parts`` in a batched round of Qwen3-8B (a dense target: its attention batches)."""
    return [
        _attention_parts("verify P=16 ar N=1", row, cc, row.decode, 1, 16, tree=False, split=False),
        _attention_parts("verify P=16 B=16 N=17", row, cc, row.small, 17, 16, tree=True, split=False),
        _attention_parts("verify P=4 B=64 N=65", row, cc, row.large, 65, 4, tree=True, split=True),
        _attention_parts(
            "drafter P=4 N=16", row, cc, row.small, 16, 4, tree=False, split=True, all_visible=True
        ),
        _attention_parts(
            "drafter P=4 N=16 window 2048",
            row,
            cc,
            row.small,
            16,
            4,
            tree=False,
            split=True,
            all_visible=True,
            window=2048,
        ),
    ]


def _attention_parts(
    case: str,
    row: ArchRow,
    cc: int,
    tiles: Tiles,
    nodes: int,
    seqs: int,
    tree: bool,
    split: bool,
    all_visible: bool = False,
    window: int = 0,
) -> Spec:
    """One launch over ``seqs`` sequences' rows padded to ``nodes``, as ``attend_slots`` lays them out
    (q and out: [Hq, P, N, D] buffers seen as [P, Hq, N, D]), over layer 0 of 64 slots' caches."""
    spec = _attention(f"parts {case}", row, cc, tiles, nodes, 0, tree, split)
    q = _empty(HQ, seqs, nodes, HEAD_DIM, dtype=torch.bfloat16).transpose(0, 1)
    caches = _empty(64, LAYERS, HKV, CONTEXT + BUDGET + 1, HEAD_DIM, dtype=torch.bfloat16)[:, 0]
    desc = TensorDescriptor(
        caches, list(caches.shape), list(caches.stride()), [1, 1, tiles.block_n, HEAD_DIM]
    )
    part = _empty(4, HQ, seqs, nodes, HEAD_DIM) if split else q  # q: unused, as in the launch
    bits = _empty(seqs, nodes, cdiv(nodes, 32), dtype=torch.int32) if tree else q
    args = dict(
        spec.args,
        Q=q,
        K=desc,
        V=desc,
        BITS=bits,
        OUT=q,
        PART_ACC=part,
        PART_ML=_empty(4, HQ, seqs, nodes, 2) if split else q,
        SLOTS=_empty(seqs, dtype=torch.int64),
        ROWS=_empty(seqs, dtype=torch.int32),
        **_strides("stride_qz stride_qh stride_qn stride_qd", q),
        **_strides("stride_oz stride_oh stride_on stride_od", q),
        **_strides("stride_bz stride_bn", bits),
        **(
            _strides("stride_ps stride_ph stride_pz stride_pn", part)
            if split
            else dict.fromkeys(("stride_ps", "stride_ph", "stride_pz", "stride_pn"), 0)
        ),
        n_nodes=nodes,
        CTX=_empty(seqs, dtype=torch.int64),
    )
    return replace(spec, args=args, constexprs={**spec.constexprs, "ALL": all_visible, "WINDOW": window})


def merge_spec(cc: int, splits: int) -> Spec:
    acc = _empty(splits, HQ, BUDGET + 1, HEAD_DIM)
    out = _empty(HQ, BUDGET + 1, HEAD_DIM, dtype=torch.bfloat16)
    args = dict(
        MAIN_ACC=acc,
        MAIN_ML=_empty(splits, HQ, BUDGET + 1, 2),
        TAIL_ACC=acc,
        TAIL_ML=_empty(splits, HQ, BUDGET + 1, 2),
        OUT=out,
        **_strides("stride_ms stride_mh stride_mn", acc),
        **_strides("stride_ts stride_th stride_tn", acc),
        **_strides("stride_oh stride_on stride_od", out),
        n_nodes=BUDGET + 1,
        main_splits=splits,
        tail_splits=splits,
        tail_node0=BUDGET,
    )
    block_r, splits_c = tree_attention.merge_tiles(splits, HEAD_DIM)
    return Spec(
        "merge_splits",
        f"B=1024 {splits} splits, {block_r} rows x {splits_c} splits a load",
        cc,
        tree_attention._merge_splits_kernel,
        args,
        dict(HEAD_DIM=HEAD_DIM, D_PAD=HEAD_DIM, BLOCK_R=block_r, SPLITS_C=splits_c, PDL=PDL),
        4,
    )


def visibility_spec(cc: int) -> Spec:
    nodes = BUDGET + 1
    bits = _empty(nodes, cdiv(nodes, 32), dtype=torch.int32)
    args = dict(
        PARENTS=_empty(nodes, dtype=torch.int64),
        DEPTH=_empty(nodes, dtype=torch.int64),
        BITS=bits,
        stride_bn=bits.stride(0),
    )
    return Spec(
        "tree_visibility",
        f"N={nodes}",
        cc,
        tree_attention._visibility_kernel,
        args,
        dict(WORDS=bits.shape[1], WORDS_PAD=next_pow2(bits.shape[1])),
        1,
    )


# --- tree build: marginal top-k and the tree kernel -----------------------------------------------


def topk_specs(cc: int) -> list[Spec]:
    """The five launches of ``marginal_topk`` for k = 1024 over the drafter's 15 x 151936 logits."""
    k = BUDGET
    m, tiles_per_prog, n_prog, cap, kernels = marginal_topk.topk_launch(VOCAB, k)
    rows = DRAFT_POSITIONS
    x = _empty(rows, VOCAB, dtype=torch.bfloat16)
    part_max, part_m, part_s = _empty(rows, n_prog, m), _empty(rows, n_prog), _empty(rows, n_prog)
    tau, count = _empty(rows, dtype=torch.int32), _empty(rows, dtype=torch.int32)
    lse, cand = _empty(rows), _empty(rows, cap, dtype=torch.int64)
    vals, toks = _empty(rows, k), _empty(rows, k, dtype=torch.int64)
    stride = x.stride(0)
    case = f"k={k} M={m}"
    mod = marginal_topk
    return [
        Spec(
            "marginal_topk.partials",
            case,
            cc,
            mod._partials_kernel,
            dict(
                X=x,
                PART_MAX=part_max,
                PART_M=part_m,
                PART_S=part_s,
                stride_row=stride,
                vocab=VOCAB,
                tiles_per_prog=tiles_per_prog,
                n_prog=n_prog,
            ),
            *kernels["partials"],
        ),
        Spec(
            "marginal_topk.threshold",
            case,
            cc,
            mod._threshold_kernel,
            dict(
                PART_MAX=part_max,
                PART_M=part_m,
                PART_S=part_s,
                TAU=tau,
                LSE=lse,
                COUNT=count,
                n_prog=n_prog,
                k=k,
            ),
            *kernels["threshold"],
        ),
        Spec(
            "marginal_topk.collect",
            case,
            cc,
            mod._collect_kernel,
            dict(
                X=x,
                TAU=tau,
                COUNT=count,
                CAND=cand,
                stride_row=stride,
                vocab=VOCAB,
                tiles_per_prog=tiles_per_prog,
                cap=cap,
            ),
            *kernels["collect"],
        ),
        Spec(
            "marginal_topk.exact",
            case,
            cc,
            mod._exact_kernel,
            dict(
                X=x,
                COUNT=count,
                CAND=cand,
                stride_row=stride,
                vocab=VOCAB,
                k=k,
                cap=cap,
                index_bits=VOCAB.bit_length(),
            ),
            *kernels["exact"],
        ),
        Spec(
            "marginal_topk.rank",
            case,
            cc,
            mod._rank_kernel,
            dict(CAND=cand, COUNT=count, LSE=lse, VALS=vals, TOKS=toks, k=k, cap=cap),
            *kernels["rank"],
        ),
    ]


def tree_spec(cc: int) -> Spec:
    """``tree_from_topk``'s single program at budget 1024 (16 warps, CHUNK 512)."""
    budget = k = BUDGET
    constexprs, warps = tree_build.tree_launch(budget)
    bp = constexprs["BP"]
    n_pairs = tree_build.candidate_pairs(budget, k, META)[0].shape[0]
    i32, i64 = torch.int32, torch.int64
    tokens = _empty(budget + 1, dtype=i64)
    args = dict(
        VALS=_empty(DRAFT_POSITIONS, k),
        TOKS=_empty(DRAFT_POSITIONS, k, dtype=i64),
        TAB_RHO=_empty(n_pairs, dtype=i32),
        TAB_R=_empty(n_pairs, dtype=i32),
        ROOT=_empty(1, dtype=i64),
        LS=_empty(DRAFT_POSITIONS, bp),
        LRHO=_empty(DRAFT_POSITIONS, bp, dtype=i32),
        LR=_empty(DRAFT_POSITIONS, bp, dtype=i32),
        LEN=_empty(DRAFT_POSITIONS, dtype=i32),
        CK=_empty(n_pairs, dtype=i64),
        TOKENS=tokens,
        PARENTS=tokens,
        DEPTH=tokens,
        depth_max=DRAFT_POSITIONS,
        budget=budget,
        k=k,
        n_pairs=n_pairs,
    )
    return Spec("tree_build.tree", f"B={budget}", cc, tree_build._tree_kernel, args, constexprs, warps)


# --- tree walk and KV compaction -----------------------------------------------------------------


def walk_specs(cc: int) -> list[Spec]:
    """``_partial_choices`` (greedy and sampled) and ``_walk_kernel`` for a 1025-node tree."""
    n = BUDGET + 1
    choice = tree_walk.choice_launch(n, VOCAB, SMS[cc])
    splits = choice.meta["SPLITS"]
    logits = _empty(n, VOCAB, dtype=torch.bfloat16)
    part_val, part_idx = _empty(n, splits), _empty(n, splits, dtype=torch.int32)
    specs = []
    for sample in (False, True):
        args = dict(
            LOGITS=logits,
            SEED=_empty(1, dtype=torch.int64) if sample else part_idx,
            PART_VAL=part_val,
            PART_IDX=part_idx,
            **_strides("stride_ln stride_lv", logits),
            n_rows=n,
            vocab=VOCAB,
            chunk=choice.chunk,
            inv_temperature=1.25,
        )
        specs.append(
            Spec(
                "tree_walk.choice",
                f"N={n} {'sample' if sample else 'greedy'} {choice.meta['BLOCK_R']}x{choice.meta['BLOCK_V']}",
                cc,
                tree_walk._choice_kernel,
                args,
                dict(SAMPLE=sample, **choice.meta),
                choice.warps,
            )
        )
    tokens, scalar = _empty(n, dtype=torch.int64), _empty((), dtype=torch.int64)
    args = dict(
        TOKENS=tokens,
        PARENTS=tokens,
        PART_VAL=part_val,
        PART_IDX=part_idx,
        PATH=tokens,
        PATH_LEN=scalar,
        BONUS=scalar,
        n_nodes=n,
    )
    specs.append(
        Spec(
            "tree_walk.walk",
            f"N={n}",
            cc,
            tree_walk._walk_kernel,
            args,
            *tree_walk.walk_launch(n, splits),
        )
    )
    return specs


def compact_specs(cc: int) -> list[Spec]:
    """One sequence's compaction, and a batched round's of 16 sequences in their slots (ddtree/16)."""
    found = []
    for parts, n, slots in ((0, BUDGET + 1, 1), (GDN_BATCH, 17, GDN_BATCH + 1)):
        cache = _empty(slots, LAYERS * HKV, CONTEXT + n, HEAD_DIM, dtype=torch.bfloat16)
        path = _empty(max(1, parts), n, dtype=torch.int64)
        lengths = _empty(parts, dtype=torch.int64) if parts else _empty((), dtype=torch.int64)
        args = dict(
            K=cache,
            V=cache,
            SLOTS=lengths if parts else path,
            PATH=path,
            PATH_LEN=lengths,
            CTX=lengths,
            **_strides("stride_slot stride_h stride_s stride_d", cache),
            n_path=n,
        )
        found.append(
            Spec(
                "kv_compact",
                f"{f'forest P={parts} N={n} ' if parts else ''}{LAYERS} layers",
                cc,
                kv_compact._compact_kernel,
                args,
                dict(HEAD_DIM=HEAD_DIM, D_PAD=HEAD_DIM, BLOCK_P=16, BATCHED=parts > 0),
                4,
            )
        )
    return found


# --- the decoder layer's fused steps ----------------------------------------------------------------


HIDDEN, INTER = 4096, 12288


def layer_specs(cc: int) -> list[Spec]:
    """RMSNorm (+ residual), q/k norm + RoPE + cache write, SwiGLU's gate and the skinny matmul."""
    bf16 = torch.bfloat16
    norm = _rms_norm(cc, None)
    rope = _qk_rope(cc, HQ, HKV, HEAD_DIM, HEAD_DIM, gated=False, w_dtype=bf16)
    gate_up = _empty(257, 2 * INTER, dtype=bf16)
    act = _empty(257, INTER, dtype=bf16)
    swiglu = Spec(
        "silu_mul",
        f"I={INTER}",
        cc,
        silu_mul._silu_mul_kernel,
        dict(GU=gate_up, OUT=act, stride_g=gate_up.stride(0), stride_o=act.stride(0), inner=INTER),
        dict(BLOCK=1024, PDL=PDL),
        4,
    )
    kv_rope = _qk_rope(cc, 0, HKV, HEAD_DIM, HEAD_DIM, gated=False, w_dtype=bf16)
    found = [norm, rope, kv_rope, swiglu]
    for n, k in ((HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)):
        found.append(_skinny(cc, n, k))
    return found


def _rms_norm(cc: int, group: int | None, chunk: int | None = None) -> Spec:
    """RMSNorm + residual of 257 rows of Qwen3-8B's hidden size; with `group`, its output also
    quantized for FP8 linears (per 128-column group, or per row when group >= H); with `chunk`, one
    decode row quantized in chunks of that many columns (`rms_norm.QUANT_CHUNK`)."""
    bf16, block = torch.bfloat16, next_pow2(HIDDEN)
    x = _empty(257, HIDDEN, dtype=bf16)
    q, s = _empty(257, HIDDEN, dtype=torch.float8_e4m3fn), _empty(257, cdiv(HIDDEN, group or HIDDEN))
    fmt = "" if group is None else (" + e4m3 per row" if group >= HIDDEN else f" + e4m3 by {group}")
    return Spec(
        "rms_norm",
        f"H={HIDDEN} + residual{fmt}{f', {chunk}-column chunks' if chunk else ''}",
        cc,
        rms_norm._rms_norm_kernel,
        dict(
            X=x,
            RES=x,
            W=_empty(HIDDEN, dtype=bf16),
            OUT=x,
            RES_OUT=x,
            Q=q,
            S=s,
            stride_x=HIDDEN,
            stride_r=HIDDEN,
            stride_o=HIDDEN,
            stride_ro=HIDDEN,
            stride_q=HIDDEN,
            stride_s=s.stride(0),
            n_cols=HIDDEN,
            eps=1e-6,
        ),
        dict(
            HAS_RES=True,
            BLOCK=block,
            CHUNK=chunk or block,
            QUANT=group is not None,
            GROUP=group if group is not None and group < HIDDEN else block,
            PDL=PDL,
        ),
        8,
    )


def _qk_rope(cc: int, hq: int, hkv: int, d: int, rot: int, gated: bool, w_dtype: torch.dtype) -> Spec:
    """q/k norm + RoPE + cache write of 257 rows: Qwen3's (bf16 weights, all of D rotated), a DFlash
    drafter's context rows (hq = 0: keys and values alone) or Qwen3.5's gated attention (a gate after
    each query head, fp32 (1 + w) scales, rot of D rotated)."""
    bf16 = torch.bfloat16
    width = 2 * d if gated else d
    heads = f"{hq}/{hkv} heads" if hq else f"{hkv} K/V heads alone"
    qkv = _empty(257, hq * width + 2 * hkv * d, dtype=bf16)
    cache_ = _empty(hkv, CONTEXT + BUDGET + 1, d, dtype=bf16)
    table_ = _empty(CONTEXT + BUDGET + 1, rot)
    q = _empty(257, hq, d, dtype=bf16)
    return Spec(
        "qk_rope",
        f"{'gated ' if gated else ''}{heads} D={d}{f' rotary {rot}' if rot < d else ''}",
        cc,
        qk_rope._qk_rope_kernel,
        dict(
            QKV=qkv,
            QW=_empty(d, dtype=w_dtype),
            KW=_empty(d, dtype=w_dtype),
            COS=table_,
            SIN=table_,
            POS=_empty(257, dtype=torch.int64),
            K=cache_,
            V=cache_,
            Q_OUT=q,
            CTX=_empty((), dtype=torch.int64),
            stride_t=qkv.stride(0),
            stride_ct=table_.stride(0),
            stride_kh=cache_.stride(0),
            stride_ks=cache_.stride(1),
            stride_qt=q.stride(0),
            stride_qh=q.stride(1),
            eps=1e-6,
        ),
        dict(
            HQ=hq,
            HKV=hkv,
            HEAD_DIM=d,
            Q_WIDTH=width,
            ROT=rot,
            HALF_PAD=rot // 2,
            REST_PAD=max(1, next_pow2(d - rot)),
            PDL=PDL,
        ),
        1,
    )


def _skinny(cc: int, n: int, k: int) -> Spec:
    """The skinny matmul's launch for a weight [n, k] at its default config on ``cc``'s SM count."""
    bf16 = torch.bfloat16
    cfg = skinny_matmul.default_config(n, k, SMS[cc])
    w, xs, out = _empty(n, k, dtype=bf16), _empty(16, k, dtype=bf16), _empty(16, n, dtype=bf16)
    part = _empty(cfg.split_k, 1, n) if cfg.split_k > 1 else out
    return Spec(
        "skinny_matmul",
        f"N={n} K={k} {cfg.block_n}x{cfg.block_k} split {cfg.split_k}",
        cc,
        skinny_matmul._skinny_kernel,
        dict(
            X=xs,
            W=w,
            OUT=out,
            PART=part,
            COUNTS=_empty(split_k.MAX_TILES, dtype=torch.int32),
            stride_xt=k,
            stride_wn=k,
            stride_ot=n,
            n_rows=1,
            n_cols=n,
            k_total=k,
            k_per_split=split_k.split_span(k, cfg.split_k, cfg.block_k),
        ),
        dict(BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT=cfg.split_k > 1, PRECISION=0, PDL=PDL),
        cfg.num_warps,
        cfg.num_stages,
    )


# --- the Qwen3.6-27B hybrid: Gated DeltaNet layers and gated attention ---------------------------------

# 48 DeltaNet layers of 16 key / 48 value heads of 128, conv width 4; 16 gated attention layers of 24/4
# heads of 256 (a quarter rotated); hidden 5120, intermediate 17408
GDN_HK, GDN_HV, GDN_D, GDN_LAYERS, CONV = 16, 48, 128, 48, 4
GDN_C = 2 * GDN_HK * GDN_D + GDN_HV * GDN_D
GDN_PROJ = GDN_C + GDN_HV * GDN_D + 2 * GDN_HV
H27, INTER27, HQ27, HKV27, D27 = 5120, 17408, 24, 4, 256
GDN_BATCH = 16  # sequences of a batched round whose `ar` steps (or trees of one size) are one launch
GDN_HEADS = dict(HK=GDN_HK, HV=GDN_HV, DK=GDN_D, DV=GDN_D)  # the DeltaNet kernels' head constexprs


def gdn_specs(cc: int) -> list[Spec]:
    """A DeltaNet layer's kernels at the 27B shapes: inputs (a tree, the `ar` step, a prefill, the
    `ar` steps of 16 sequences, a forest of 16 trees), the fused step (one sequence, 16), the tree
    plan and kernel (the node blocks each verify size takes; a forest of 16 trees of the batched
    sizes), the output norm and the commit of all 48 layers."""
    bf16, i64 = torch.bfloat16, torch.int64
    found = []
    for case, n, chain, update, stage, part in (
        ("tree N=257", 257, False, False, True, 0),
        ("ar step", 1, True, True, False, 0),
        ("prefill T=4096", 4096, True, False, False, 0),
        (f"ar steps P={GDN_BATCH}", GDN_BATCH, True, True, False, 1),
        (f"forest P={GDN_BATCH} N=17", GDN_BATCH * 17, False, False, True, 17),
    ):
        batched, forest = part > 0, part > 1  # part: tokens of each sequence (0: one sequence)
        proj = _empty(n, GDN_PROJ, dtype=bf16)
        windows = _empty(n, CONV, dtype=torch.int32)
        block_t, warps = gdn_inputs.tile(n, GDN_D)
        args = dict(
            PROJ=proj,
            CONV_STATE=_empty(CONV - 1, GDN_C, dtype=bf16),
            CONV_W=_empty(GDN_C, CONV, dtype=bf16),
            WINDOWS=proj if chain else windows,
            A_LOG=_empty(GDN_HV, dtype=bf16),
            DT_BIAS=_empty(GDN_HV, dtype=bf16),
            Q=_empty(n, GDN_HK, GDN_D, dtype=bf16),
            K=_empty(n, GDN_HK, GDN_D, dtype=bf16),
            V=_empty(n, GDN_HV, GDN_D, dtype=bf16),
            G=_empty(n, GDN_HV),
            BETA=_empty(n, GDN_HV),
            X_STAGE=_empty(n, GDN_C, dtype=bf16) if stage else proj,
            K_STAGE=_empty(n, GDN_HK, GDN_D, dtype=bf16) if forest else proj,
            SLOTS=_empty(n, dtype=i64) if batched else proj,
            n_tokens=n,
            n_part=max(1, part),
            stride_pt=GDN_PROJ,
            stride_slot=GDN_LAYERS * (CONV - 1) * GDN_C if batched else 0,
            stride_cs=GDN_C,
            stride_wt=0 if chain else CONV,
            stride_xt=GDN_C if stage else 0,
            stride_xslot=GDN_LAYERS * part * GDN_C if forest else 0,
            stride_kslot=GDN_LAYERS * part * GDN_HK * GDN_D if forest else 0,
            q_scale=GDN_D**-0.5,
        )
        constexprs = dict(
            **GDN_HEADS,
            BLOCK_T=block_t,
            BLOCK_D=GDN_D,
            KERNEL=CONV,
            CHAIN=chain,
            UPDATE_CONV=update,
            STAGE_X=stage,
            STAGE_K=forest,
            BATCHED=batched,
            PDL=PDL,
        )
        found.append(Spec("gdn_inputs", case, cc, gdn_inputs._gdn_inputs_kernel, args, constexprs, warps))
    found += [_gdn_step(cc, n, None) for n in (1, GDN_BATCH)]
    # dflash's chain, ddtree at budgets 16, 64, 256; the forests of a batched round (0: one tree)
    for n, parts in ((16, 0), (17, 0), (65, 0), (257, 0), (16, GDN_BATCH), (17, GDN_BATCH), (65, GDN_BATCH)):
        forest, p = parts > 0, max(1, parts)
        block_t = gdn_tree.node_block(n, cc)
        blocks = cdiv(n, block_t)
        pad = blocks * block_t
        q, v = _empty(p, n, GDN_HK, GDN_D, dtype=bf16), _empty(p, n, GDN_HV, GDN_D, dtype=bf16)
        steps = _empty(p, blocks, dtype=torch.int32)
        common = dict(
            BLOCKS=_empty(p, blocks, blocks, dtype=torch.int32),
            SLOTS=_empty(parts, dtype=i64) if forest else steps,
            n_nodes=n,
            n_blocks=blocks,
            stride_anc=pad,
        )
        a = _empty(p, GDN_HV, pad, pad, dtype=bf16)  # A and P in the model's dtype
        inv = _empty(p, GDN_HV, blocks, block_t, block_t)
        r = _empty(p, GDN_HV, pad, GDN_D)
        shapes = dict(**GDN_HEADS, BLOCK_K=32, BLOCK_T=block_t, PRECISION=0)
        case = f"{f'forest P={parts} ' if forest else ''}N={n} {block_t}"
        found.append(
            Spec(
                "gdn_tree.blocks",
                case,
                cc,
                gdn_tree._tree_blocks_kernel,
                dict(
                    Q=q,
                    K=q,
                    V=v,
                    BETA=_empty(p, n, GDN_HV),
                    G=_empty(p, n, GDN_HV),
                    S0=_empty(GDN_HV, GDN_D, GDN_D),
                    GSUM=_empty(GDN_HV, n),
                    ANC=_empty(p, pad, pad, dtype=torch.int8),
                    STEPS=steps,
                    A=a,
                    P=a,
                    INV=inv,
                    R=r,
                    O0=r,
                    stride_state=GDN_LAYERS * GDN_HV * GDN_D * GDN_D if forest else 0,
                    stride_gsum=GDN_LAYERS * GDN_HV * n if forest else 0,
                    **common,
                ),
                {**shapes, "BLOCK_V": gdn_tree.STATE_BLOCK_V, "FOREST": forest},
                4,
                num_stages=1,
            )
        )
        found.append(
            Spec(
                "gdn_tree.solve",
                f"{case}x{gdn_tree.BLOCK_V}{' tail' if gdn_tree.lone_tail(n, block_t) else ''}",
                cc,
                gdn_tree._tree_solve_kernel,
                dict(
                    A=a,
                    P=a,
                    INV=inv,
                    R=r,
                    O0=r,
                    OUT=v,
                    D=_empty(GDN_HV, n, GDN_D),
                    stride_d=GDN_LAYERS * GDN_HV * n * GDN_D if forest else 0,
                    **common,
                ),
                dict(
                    HV=GDN_HV,
                    DV=GDN_D,
                    BLOCK_T=block_t,
                    BLOCK_V=gdn_tree.BLOCK_V,
                    TAIL=gdn_tree.lone_tail(n, block_t),
                    PRECISION=0,
                    FOREST=forest,
                ),
                gdn_tree.NUM_WARPS,
            )
        )
    found.append(
        Spec(
            "gdn_tree.plan",
            "N=257",
            cc,
            gdn_tree._plan_kernel,
            dict(
                PARENTS=_empty(257, dtype=i64),
                DEPTH=_empty(257, dtype=i64),
                ANC=_empty(320, 320, dtype=torch.int8),
                WINDOWS=_empty(257, CONV, dtype=torch.int32),
                stride_anc=320,
            ),
            dict(KERNEL=CONV),
            1,
        )
    )
    found.append(_gated_rms_norm(cc, None))
    # the commit of one sequence's tree at budget 256, and of a batched round's 16 at budget 16
    for parts, n in ((0, 257), (GDN_BATCH, 17)):
        p, slots = max(1, parts), GDN_BATCH + 1 if parts else 1
        path = _empty(p, n, dtype=i64)
        lengths = _empty(parts, dtype=i64) if parts else _empty((), dtype=i64)
        states = _empty(slots, GDN_LAYERS, GDN_HV, GDN_D, GDN_D)
        k = _empty(slots, GDN_LAYERS, n, GDN_HK, GDN_D, dtype=bf16)
        d = _empty(slots, GDN_LAYERS, GDN_HV, n, GDN_D)
        gsum = _empty(slots, GDN_LAYERS, GDN_HV, n)
        conv = _empty(slots, GDN_LAYERS, CONV - 1, GDN_C, dtype=bf16)
        x = _empty(slots, GDN_LAYERS, n, GDN_C, dtype=bf16)
        case = f"{f'forest P={parts} ' if parts else ''}x{GDN_LAYERS} N={n}"
        stride = {
            name: t.stride(0) if parts else 0 for name, t in dict(states=states, k=k, d=d, g=gsum).items()
        }
        found.append(
            Spec(
                "gdn_commit.state",
                case,
                cc,
                gdn_commit._commit_state_kernel,
                dict(
                    STATES=states,
                    K=k,
                    D=d,
                    GSUM=gsum,
                    PATH=path,
                    PATH_LEN=lengths,
                    SLOTS=lengths if parts else path,
                    n_nodes=n,
                    stride_state=stride["states"],
                    stride_k=stride["k"],
                    stride_d=stride["d"],
                    stride_g=stride["g"],
                ),
                dict(**GDN_HEADS, DK_PAD=GDN_D, BLOCK_V=32, BLOCK_P=16, PRECISION=0, BATCHED=parts > 0),
                4,
            )
        )
        found.append(
            Spec(
                "gdn_commit.conv",
                case,
                cc,
                gdn_commit._commit_conv_kernel,
                dict(
                    CONV=conv,
                    X=x,
                    WINDOWS=_empty(p, n, CONV, dtype=torch.int32),
                    PATH=path,
                    PATH_LEN=lengths,
                    SLOTS=lengths if parts else path,
                    n_nodes=n,
                    channels=GDN_C,
                    stride_conv=conv.stride(0) if parts else 0,
                    stride_x=x.stride(0) if parts else 0,
                ),
                dict(KERNEL=CONV, BLOCK=1024, BATCHED=parts > 0),
                4,
            )
        )
    return found


def hybrid_layer_specs(cc: int) -> list[Spec]:
    """The 27B's gated attention q/k norm + partial RoPE, its output gate over 257 rows, and its
    projections' skinny matmuls."""
    found = [_qk_rope(cc, HQ27, HKV27, D27, D27 // 4, gated=True, w_dtype=torch.float32)]
    found.append(_attention_gate(cc, None))
    shapes = (
        (GDN_PROJ, H27),
        ((2 * HQ27 + 2 * HKV27) * D27, H27),
        (H27, GDN_HV * GDN_D),
        (2 * INTER27, H27),
        (H27, INTER27),
    )
    for n, k in shapes:
        found.append(_skinny(cc, n, k))
    return found


def _producer_out(rows: int, width: int, group: int | None) -> tuple[torch.Tensor, dict[str, object]]:
    """A producer's outputs as its wrapper passes them: (OUT, its Q, S and their row strides). With a
    group: the e4m3 rows (OUT too, unused) and a scale per `group` columns; without: the bf16 rows,
    and OUT with strides 0 for Q and S."""
    if group is None:
        out = _empty(rows, width, dtype=torch.bfloat16)
        return out, dict(Q=out, S=out, stride_q=0, stride_s=0)
    q, s = _empty(rows, width, dtype=torch.float8_e4m3fn), _empty(rows, cdiv(width, group))
    return q, dict(Q=q, S=s, stride_q=q.stride(0), stride_s=s.stride(0))


def _gdn_step(cc: int, n: int, group: int | None) -> Spec:
    """The fused DeltaNet step of n sequences (`ar`), its heads quantized by `group` columns when set."""
    bf16 = torch.bfloat16
    vec, head = _empty(n, GDN_HV * GDN_D, dtype=bf16), _empty(n, GDN_HK, GDN_D, dtype=bf16)
    state = _empty(GDN_HV, GDN_D, GDN_D)
    out, quant = _producer_out(n, GDN_HV * GDN_D, group)
    splits = gdn_step.column_splits(GDN_HV, GDN_D, SMS[cc])
    return Spec(
        "gdn_step",
        ("ar step" if n == 1 else f"ar steps P={n}")
        + (f" + e4m3 by {group}" if group else "")
        + (f", {splits} programs a head" if splits > 1 else ""),
        cc,
        gdn_step._gdn_step_kernel,
        dict(
            Q=head,
            K=head,
            V=vec,
            G=_empty(n, GDN_HV),
            BETA=_empty(n, GDN_HV),
            STATE=state,
            PROJ=_empty(n, GDN_PROJ, dtype=bf16),
            W=_empty(GDN_D, dtype=bf16),
            OUT=out,
            Q_OUT=quant["Q"],
            S_OUT=quant["S"],
            SLOTS=_empty(n, dtype=torch.int64) if n > 1 else state,
            O_PART=_empty(n, GDN_HV, GDN_D, dtype=bf16) if splits > 1 else out,
            COUNTS=_empty(split_k.MAX_TILES, dtype=torch.int32),
            z_col=GDN_C,
            eps=1e-6,
            stride_pt=GDN_PROJ,
            stride_slot=GDN_LAYERS * GDN_HV * GDN_D * GDN_D if n > 1 else 0,
            stride_q=quant["stride_q"],
            stride_s=quant["stride_s"],
        ),
        dict(
            **GDN_HEADS,
            DK_PAD=GDN_D,
            DV_PAD=GDN_D,
            BATCHED=n > 1,
            GROUP=group or 0,
            SPLITS=splits,
            PDL=PDL,
        ),
        8 if splits == 1 else 4,
    )


def _gated_rms_norm(cc: int, group: int | None) -> Spec:
    """The DeltaNet output norm over 257 rows (a verify pass), quantized by `group` columns when set."""
    bf16 = torch.bfloat16
    out, quant = _producer_out(257, GDN_HV * GDN_D, group)
    return Spec(
        "gated_rms_norm",
        "N=257" + (f" + e4m3 by {group}" if group else ""),
        cc,
        gated_rms_norm._gated_rms_norm_kernel,
        dict(
            X=_empty(257, GDN_HV, GDN_D, dtype=bf16),
            PROJ=_empty(257, GDN_PROJ, dtype=bf16),
            W=_empty(GDN_D, dtype=bf16),
            OUT=out,
            stride_ot=GDN_HV * GDN_D,
            stride_oh=GDN_D,
            stride_pt=GDN_PROJ,
            stride_out=GDN_HV * GDN_D,
            **quant,
            z_col=GDN_C,
            eps=1e-6,
            n_heads=GDN_HV,
        ),
        dict(DV=GDN_D, DV_PAD=GDN_D, BLOCK_H=gated_rms_norm.HEADS_PER_PROGRAM, GROUP=group or 0, PDL=PDL),
        4,
    )


def _attention_gate(cc: int, group: int | None) -> Spec:
    """The 27B's attention output gate over 257 rows, quantized by `group` columns when set."""
    bf16 = torch.bfloat16
    qkv_width = (2 * HQ27 + 2 * HKV27) * D27
    out, quant = _producer_out(257, HQ27 * D27, group)
    return Spec(
        "attention_gate",
        "N=257" + (f" + e4m3 by {group}" if group else ""),
        cc,
        attention_gate._attention_gate_kernel,
        dict(
            ATT=_empty(HQ27, 257, D27, dtype=bf16),
            QKV=_empty(257, qkv_width, dtype=bf16),
            OUT=out,
            stride_oh=257 * D27,
            stride_ot=D27,
            stride_qt=qkv_width,
            stride_out=HQ27 * D27,
            **quant,
            n_heads=HQ27,
        ),
        dict(D=D27, D_PAD=D27, BLOCK_H=attention_gate.HEADS_PER_PROGRAM, GROUP=group or 0, PDL=PDL),
        4,
    )


# --- the FP8 target's linears (ddtree_kernels/fp8_skinny.py, ddtree_kernels/fp8_gemm.py) ----------------

FP8_BLOCK = (128, 128)  # Qwen's weight_block_size; per-channel checkpoints are (1, K)
PROJECTIONS = ((HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER))  # o, gate_up, down of Qwen3-8B
DRAFT_HEAD = (VOCAB, HIDDEN)  # the LM head's FP8 copy the drafts go through (engine.draft_head)


def fp8_specs(cc: int) -> list[Spec]:
    """The skinny kernel on the three projection shapes and the drafts' LM head (block scales) and
    on the widest K with per-channel scales; the activation quantization and the GEMM at 257 rows,
    both formats."""
    e4m3, bf16 = torch.float8_e4m3fn, torch.bfloat16
    found = []
    blocked = (*PROJECTIONS, DRAFT_HEAD)
    for (n, k), block in [*((shape, FP8_BLOCK) for shape in blocked), ((HIDDEN, INTER), (1, INTER))]:
        cfg = fp8_skinny.default_config(n, k, block[1], SMS[cc])
        per_row = block[1] >= k
        w, scale = _empty(n, k, dtype=e4m3), _empty(cdiv(n, block[0]), cdiv(k, block[1]))
        xs, out = _empty(16, k, dtype=e4m3), _empty(16, n, dtype=bf16)
        x_scale = _empty(16, 1 if per_row else cdiv(k, block[1]))
        part = _empty(cfg.split_k, 1, n) if cfg.split_k > 1 else out
        found.append(
            Spec(
                "fp8_skinny",
                f"N={n} K={k} {'per-channel' if per_row else 'block 128'} {cfg.block_n}x{cfg.block_k} "
                f"split {cfg.split_k}",
                cc,
                fp8_skinny._fp8_skinny_kernel,
                dict(
                    X8=xs,
                    X_SCALE=x_scale,
                    W=w,
                    W_SCALE=scale,
                    OUT=out,
                    PART=part,
                    COUNTS=_empty(split_k.MAX_TILES, dtype=torch.int32),
                    stride_xt=k,
                    stride_xs=x_scale.stride(0),
                    stride_wn=k,
                    stride_ws=scale.stride(0),
                    stride_ot=n,
                    n_rows=1,
                    n_cols=n,
                    k_total=k,
                    k_per_split=split_k.split_span(k, cfg.split_k, cfg.block_k),
                    block_n=block[0],
                ),
                dict(
                    BLOCK_N=cfg.block_n,
                    BLOCK_K=cfg.block_k,
                    GROUP_K=cfg.block_k if per_row else block[1],
                    PER_ROW=per_row,
                    SPLIT=cfg.split_k > 1,
                    PRECISION=0,
                    PDL=PDL,
                ),
                cfg.num_warps,
                cfg.num_stages,
            )
        )
    rows, n, k = 257, 2 * INTER, HIDDEN
    for block in (FP8_BLOCK, (1, k)):
        per_row = block[1] >= k
        group = k if per_row else block[1]
        width = min(group, k)
        quant_block = min(fp8_gemm.QUANT_BLOCK, next_pow2(width))
        x, a = _empty(rows, k, dtype=bf16), _empty(rows, k, dtype=e4m3)
        a_scale = _empty(rows, cdiv(k, group))
        fmt = "per-channel" if per_row else "block 128"
        found.append(
            Spec(
                "fp8_gemm.act_quant",
                f"T={rows} K={k} {fmt}",
                cc,
                fp8_gemm._act_quant_kernel,
                dict(
                    X=x,
                    Q=a,
                    S=a_scale,
                    stride_x=k,
                    stride_q=k,
                    stride_s=a_scale.stride(0),
                    n_cols=k,
                    group=width,
                ),
                dict(BLOCK=quant_block, STEPS=cdiv(width, quant_block), PDL=PDL),
                4,
            )
        )
    # the GEMM at a B=64 tree's rows (a 4096-column projection: K split; a 16384-column one: one wave
    # of wide tiles), a B=256 tree's and a prefill's
    shapes = (
        (65, HIDDEN, INTER),
        (65, 4 * HIDDEN, HIDDEN),
        (257, 2 * INTER, HIDDEN),
        (4096, 2 * INTER, HIDDEN),
    )
    for rows, n, k in shapes:
        for block in (FP8_BLOCK, (1, k)) if rows == 257 else (FP8_BLOCK,):
            found.append(_fp8_gemm_spec(cc, rows, n, k, block))
    return found + fp8_producer_specs(cc)


def _fp8_gemm_spec(cc: int, rows: int, n: int, k: int, block: tuple[int, int]) -> Spec:
    """One ``_fp8_gemm_kernel`` launch with the tiles ``gemm_config`` picks for this target."""
    per_row = block[1] >= k
    group_k = 128 if per_row else block[1]
    cfg = fp8_gemm.gemm_config(rows, n, k, (cc // 10, cc % 10), SMS[cc])
    a, w = _empty(rows, k, dtype=torch.float8_e4m3fn), _empty(n, k, dtype=torch.float8_e4m3fn)
    a_scale, scale = (
        _empty(rows, 1 if per_row else cdiv(k, group_k)),
        _empty(cdiv(n, block[0]), cdiv(k, block[1])),
    )
    out = _empty(rows, n, dtype=torch.bfloat16)
    part = _empty(cfg.split_k, rows, n) if cfg.split_k > 1 else out
    fmt = "per-channel" if per_row else "block 128"
    return Spec(
        "fp8_gemm",
        f"T={rows} N={n} K={k} {fmt} {cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} "
        f"s{cfg.num_stages} split {cfg.split_k}",
        cc,
        fp8_gemm._fp8_gemm_kernel,
        dict(
            X8=TensorDescriptor(a, [rows, k], [k, 1], [cfg.block_m, group_k]),
            X_SCALE=a_scale,
            W=TensorDescriptor(w, [n, k], [k, 1], [cfg.block_n, group_k]),
            W_SCALE=scale,
            OUT=out,
            PART=part,
            COUNTS=_empty(split_k.MAX_TILES, dtype=torch.int32),
            stride_xs=a_scale.stride(0),
            stride_ws=scale.stride(0),
            stride_ot=n,
            n_rows=rows,
            n_cols=n,
            k_total=k,
            k_per_split=split_k.split_span(k, cfg.split_k, cfg.block_k),
            block_n=block[0],
        ),
        dict(
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            GROUP_K=group_k,
            PER_ROW=per_row,
            TILE_SCALE=fp8_gemm.shares_tile_scale(block, cfg),
            SPLIT=cfg.split_k > 1,
            PRECISION=0,
        ),
        cfg.num_warps,
        cfg.num_stages,
    )


def fp8_producer_specs(cc: int) -> list[Spec]:
    """RMSNorm and SwiGLU writing their outputs quantized for FP8 linears, in both scale layouts; the
    27B's DeltaNet step and output norm and its attention gate in Qwen's 128-column groups (per
    channel, their rows span programs and stay unquantized)."""
    found = [_rms_norm(cc, group) for group in (FP8_BLOCK[1], HIDDEN)]
    found.append(_rms_norm(cc, FP8_BLOCK[1], rms_norm.QUANT_CHUNK))
    gate_up = _empty(257, 2 * INTER, dtype=torch.bfloat16)
    for group in (FP8_BLOCK[1], INTER):
        per_row = group >= INTER
        q, s = _empty(257, INTER, dtype=torch.float8_e4m3fn), _empty(257, cdiv(INTER, group))
        found.append(
            Spec(
                "silu_mul_fp8",
                f"I={INTER} {'per row' if per_row else f'by {group}'}",
                cc,
                silu_mul._silu_mul_fp8_kernel,
                dict(
                    GU=gate_up,
                    Q=q,
                    S=s,
                    stride_g=gate_up.stride(0),
                    stride_q=q.stride(0),
                    stride_s=s.stride(0),
                    inner=INTER,
                ),
                dict(
                    GROUP=silu_mul.BLOCK if per_row else group,
                    BLOCK=silu_mul.BLOCK,
                    STEPS=cdiv(INTER, silu_mul.BLOCK) if per_row else 0,
                    PDL=PDL,
                ),
                4,
            )
        )
    group = FP8_BLOCK[1]
    found += [_gdn_step(cc, n, group) for n in (1, GDN_BATCH)]
    return [*found, _gated_rms_norm(cc, group), _attention_gate(cc, group)]


@cache
def specs() -> dict[str, Spec]:
    """Every spec by key: each arch row's attention choices on its targets, the rest on TARGETS."""
    found: list[Spec] = []
    for row in ROWS.values():
        for cc in row.targets:
            found += attention_specs(row, cc)
    for row in WIDE_ROWS.values():
        for cc in row.targets:
            found += attention_specs(row, cc, head_dim=256)
    for cc in TARGETS:
        found += [
            *(merge_spec(cc, splits) for splits in (4, 16)),
            visibility_spec(cc),
            *topk_specs(cc),
            tree_spec(cc),
            *walk_specs(cc),
            *compact_specs(cc),
            *layer_specs(cc),
            *gdn_specs(cc),
            *hybrid_layer_specs(cc),
            *fp8_specs(cc),
        ]
    return {spec.key: spec for spec in found}
