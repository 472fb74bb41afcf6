"""FP8 targets: the quantized linear module, and putting it in place of the checkpoint's FP8 linears.

A target checkpoint in one of the two FP8 formats (`drafter_config.quantization`) stores each
quantized linear as an e4m3 `weight` [N, K] beside its scale tensor; everything else (embeddings, LM
head, norms, the hybrid's small DeltaNet projections and conv) stays in bf16 and loads as usual, in
the requested dtype. `Fp8Linear` keeps the e4m3 weight and fp32 scales as stored and is multiplied
through `backend.fp8_linear` (`models/qwen3.py: linear`): the Triton kernels on CUDA, on the CPU the
dequantized reference. Activations are quantized on the fly as the checkpoint declares (dynamic,
per token and weight block column), so every pass, however many rows, computes the same function
and speculation stays lossless against the FP8 target.

The kernel that produces a linear's input quantizes it when every FP8 linear reading it wants the
same scale layout (`act_group`): the RMSNorm before q/k/v (or the DeltaNet in-projection) and
gate/up, and SwiGLU before the down projection (`norm_rows`, `swiglu_rows`), and in the hybrid the
attention's output gate before `o_proj` and the DeltaNet's gated norm before `out_proj`
(`produced_rows`). The rows then travel as an `Fp8Input`, quantized once, and no FP8 linear
quantizes them again; the numbers are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ddtree_kernels.host import QuantizedRows
from ddtree_runtime.backend import Backend, select_backend
from ddtree_runtime.config import ConfigError
from ddtree_runtime.fp8 import cdiv, quantize_weight
from drafter_config.quantization import Fp8Scheme, QuantConfigError, read_fp8_scheme

FP8 = torch.float8_e4m3fn


class Fp8Linear(nn.Module):
    """`x @ W.T (+ bias)` for an e4m3 weight [N, K] with fp32 scales [ceil(N / bn), ceil(K / bk)].

    `block` is (bn, bk): per-channel weights are (1, K), whose single column group makes the
    activation scale per token. Never cast it with `.to(dtype)`: the weight must stay e4m3.
    """

    def __init__(self, in_features: int, out_features: int, block: tuple[int, int], bias: bool) -> None:
        super().__init__()
        self.block = block
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=FP8), requires_grad=False)
        shape = (cdiv(out_features, block[0]), cdiv(in_features, block[1]))
        self.scale = nn.Parameter(torch.empty(shape, dtype=torch.float32), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        """For callers that hold no backend (the hybrid's projections, the LM head through the
        drafter): the FP8 matmul of x's device, the kernels on CUDA and the reference on the CPU."""
        rows = x.reshape(-1, x.shape[-1])
        out = select_backend(x.device).fp8_linear(rows, self.weight, self.scale, self.block)
        out = out.reshape(*x.shape[:-1], out.shape[-1])
        return out if self.bias is None else out + self.bias

    @classmethod
    def quantized(cls, linear: nn.Linear, block: tuple[int, int], rows_per_pass: int = 16384) -> Fp8Linear:
        """An e4m3 copy of a bias-free linear, quantized as checkpoints are (`fp8.quantize_weight`),
        `rows_per_pass` rows at a time (whole row blocks) so that an LM head never has an fp32 copy."""
        if linear.bias is not None:
            raise ValueError("only a bias-free linear is quantized here")
        weight = linear.weight.detach()
        step = max(block[0], rows_per_pass // block[0] * block[0])
        parts = [quantize_weight(weight[i : i + step], block) for i in range(0, weight.shape[0], step)]
        with torch.device("meta"):
            copy = cls(linear.in_features, linear.out_features, block, bias=False)
        copy.weight = nn.Parameter(torch.cat([w for w, _ in parts]), requires_grad=False)
        copy.scale = nn.Parameter(torch.cat([s for _, s in parts]), requires_grad=False)
        return copy

    @classmethod
    def fused(cls, parts: Sequence[Fp8Linear]) -> Fp8Linear:
        """One Fp8Linear whose output is the parts' side by side. Block scales stay per block when
        every part has whole row blocks, else they are repeated per row (block (1, bk))."""
        bn, bk = parts[0].block
        if any(p.block[1] != bk for p in parts):
            raise ValueError(
                f"cannot fuse FP8 linears of different column blocks: {[p.block for p in parts]}"
            )
        whole = all(p.weight.shape[0] % bn == 0 for p in parts)
        scales = [p.scale if whole else p.scale.repeat_interleave(bn, 0)[: p.weight.shape[0]] for p in parts]
        weight = torch.cat([p.weight.detach() for p in parts])
        bias = parts[0].bias is not None
        with torch.device("meta"):
            fused = cls(weight.shape[1], weight.shape[0], (bn if whole else 1, bk), bias)
        fused.weight = nn.Parameter(weight, requires_grad=False)
        fused.scale = nn.Parameter(torch.cat(scales), requires_grad=False)
        if bias:
            fused.bias = nn.Parameter(torch.cat([p.bias.detach() for p in parts]), requires_grad=False)
        return fused


@dataclass(frozen=True)
class Fp8Input:
    """A linear's input rows as their producer wrote them: in the model dtype (`x`, for the bf16
    linears among the readers; None when every reader is FP8) and quantized once (`q`) for the FP8
    ones."""

    x: Tensor | None
    q: QuantizedRows


def act_group(*readers: nn.Module | None) -> int | None:
    """The activation group (columns per scale: the weight's block columns, or the whole row for
    per-channel scales) shared by every FP8 linear among the `readers` of one input; None when there
    is none, or they differ: then the input stays unquantized, as for a bf16 target."""
    groups = {min(m.block[1], m.weight.shape[1]) for m in readers if isinstance(m, Fp8Linear)}
    return groups.pop() if len(groups) == 1 else None


def norm_rows(
    backend: Backend, x: Tensor, weight: Tensor, eps: float, residual: Tensor | None, group: int | None
) -> tuple[Tensor | Fp8Input, Tensor]:
    """`backend.rms_norm` (normed rows, residual stream), the normed rows also quantized by `group`
    columns (`act_group` of their readers) when it is set."""
    if group is None:
        return backend.rms_norm(x, weight, eps, residual)
    out, s, q = backend.rms_norm_fp8(x, weight, eps, residual, group)
    return Fp8Input(out, q), s


def swiglu_rows(backend: Backend, gate_up: Tensor, group: int | None) -> Tensor | Fp8Input:
    """`backend.silu_mul` of the MLP's fused projection, written quantized (and only so) for an FP8
    down projection (`group` set)."""
    if group is None:
        return backend.silu_mul(gate_up)
    return Fp8Input(None, backend.silu_mul_fp8(gate_up, group))


Produced = Tensor | QuantizedRows  # a producer seam's output: its rows, or them quantized for an FP8 reader


def produced_rows(rows: Produced) -> Tensor | Fp8Input:
    """A producer's output as its one reader takes it: rows the backend quantized for an FP8 linear
    (given its `act_group`) as an `Fp8Input`; rows it could not quantize in its kernel as they are
    (the linear quantizes them)."""
    return Fp8Input(None, rows) if isinstance(rows, QuantizedRows) else rows


def fp8_scheme(raw: dict, path: Path) -> Fp8Scheme | None:
    """The config's FP8 scheme; ConfigError naming the field for a quantization we cannot serve."""
    try:
        return read_fp8_scheme(raw)
    except QuantConfigError as err:
        raise ConfigError(f"{path}: {err.field}: {err.message} (fix: {err.hint})") from None


def stored_dtype(name: str, dtype: torch.dtype) -> torch.dtype | None:
    """How a checkpoint tensor is kept at load (`loader.read_state_dict`): e4m3 weights as stored,
    their scales (bf16 in Qwen3.5/3.6, fp32 elsewhere) in fp32; None: the model's dtype."""
    if dtype == FP8:
        return FP8
    return torch.float32 if name.endswith(("weight_scale_inv", "weight_scale")) else None


def install_fp8(
    model: nn.Module, state: dict[str, Tensor], scheme: Fp8Scheme | None, directory: Path
) -> None:
    """Replace each linear whose weight is stored in e4m3 by an Fp8Linear and rename its scale.

    Refuses float8 weights without a quantization_config, e5m2, a missing or misshapen scale, a
    quantized tensor that is not a linear's weight, and q/k/v or gate/up of mixed precision (the
    runtime fuses those).
    """
    quantized = sorted(n.removesuffix(".weight") for n, t in state.items() if t.dtype == FP8)
    odd = sorted(n for n, t in state.items() if t.dtype == torch.float8_e5m2)
    if odd:
        raise ConfigError(f"{directory}: {odd[0]} is stored as float8_e5m2 (fix: only e4m3 FP8 is served)")
    if quantized and scheme is None:
        raise ConfigError(
            f"{directory}: {quantized[0]}.weight is stored in float8 but config.json has no "
            "quantization_config (fix: restore the exporter's config.json)"
        )
    if scheme is not None and not quantized:
        raise ConfigError(
            f"{directory}: config.json declares {scheme.method} quantization but no weight is stored in "
            "float8 (fix: remove quantization_config, or download the quantized weights)"
        )
    for name in quantized:
        _replace(model, name, state, scheme, directory)
    _check_fused_groups(model, directory)


def _replace(
    model: nn.Module, name: str, state: dict[str, Tensor], scheme: Fp8Scheme, directory: Path
) -> None:
    parent_name, _, child = name.rpartition(".")
    try:
        old = model.get_submodule(name)
    except AttributeError:
        old = None
    if not isinstance(old, nn.Linear):
        raise ConfigError(
            f"{directory}: {name}.weight is stored in float8 but {name} is not a linear layer of the model "
            "(fix: only linear projections may be quantized; keep embeddings, norms and convs in bf16)"
        )
    scale = state.pop(f"{name}.{scheme.scale_name}", None)
    if scale is None:
        raise ConfigError(
            f"{directory}: {name}.weight is float8 but {name}.{scheme.scale_name} is missing "
            f"(fix: re-download the checkpoint; {scheme.method} stores one beside each weight)"
        )
    block = scheme.block or (1, old.in_features)
    with torch.device("meta"):
        new = Fp8Linear(old.in_features, old.out_features, block, old.bias is not None)
    if tuple(scale.shape) != tuple(new.scale.shape):
        raise ConfigError(
            f"{directory}: {name}.{scheme.scale_name} has shape {list(scale.shape)}, a "
            f"[{old.out_features}, {old.in_features}] weight in blocks of {list(block)} needs "
            f"{list(new.scale.shape)} (fix: check weight_block_size in config.json)"
        )
    state[f"{name}.scale"] = scale
    model.get_submodule(parent_name).register_module(child, new)


def _check_fused_groups(model: nn.Module, directory: Path) -> None:
    for prefix, module in model.named_modules():
        for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
            kinds = {
                type(getattr(module, p)) for p in group if isinstance(getattr(module, p, None), nn.Module)
            }
            if len(kinds) > 1:
                raise ConfigError(
                    f"{directory}: {prefix}.{{{','.join(group)}}} mix FP8 and unquantized weights (fix: "
                    "quantize all or none of them; the runtime runs them as one fused projection)"
                )
