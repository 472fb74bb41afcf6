"""Qwen3 dense decoder with a static KV cache and hidden-state capture for the drafter.

Shaped after gpt-fast: the cache `[L, Hkv, S_max, D]` is allocated once (tree slots included) and
written by row; `input_pos` (RoPE positions) and the cache row `context_len` are passed explicitly,
because tree nodes sit at `start + depth` while their rows are `start + node index`. Parameter names
follow Hugging Face's minus the `model.` prefix, so checkpoints load without a mapping table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddtree_runtime.backend import Backend
from ddtree_runtime.config import Qwen3Config


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 and scaled in the input dtype (as Qwen3 does)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_tables(
    head_dim: int, theta: float, max_positions: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """cos, sin: [max_positions, head_dim] in fp32 (the half-split layout of `rotate_half`)."""
    inv_freq = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    )
    freqs = torch.arange(max_positions, device=device).float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [H, T, D]; cos, sin: [T, D] (fp32, cast to x's dtype as HF does)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class MLP(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Grouped-query attention with q/k RMSNorm over the head dimension."""

    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        d, bias = cfg.head_dim, cfg.attention_bias
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * d, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * d, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * d, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def heads(self, proj: nn.Linear, x: Tensor, n: int) -> Tensor:
        """x: [T, hidden] -> [n, T, D]."""
        return proj(x).view(x.shape[0], n, self.head_dim).transpose(0, 1)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        context_len: int,
        visibility: object | None,
        backend: Backend,
    ) -> Tensor:
        # x: [T, hidden]; cos, sin: [T, D]; k_cache, v_cache: [Hkv, S_max, D] (this layer)
        t = x.shape[0]
        q = apply_rope(self.q_norm(self.heads(self.q_proj, x, self.n_heads)), cos, sin)  # [Hq, T, D]
        k = apply_rope(self.k_norm(self.heads(self.k_proj, x, self.n_kv)), cos, sin)  # [Hkv, T, D]
        v = self.heads(self.v_proj, x, self.n_kv)
        k_cache[:, context_len : context_len + t] = k
        v_cache[:, context_len : context_len + t] = v
        out = backend.attention(
            q, k_cache, v_cache, context_len, visibility, self.head_dim**-0.5
        )  # [Hq, T, D]
        return self.o_proj(out.transpose(0, 1).reshape(t, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen3(nn.Module):
    """The target model. `forward` returns logits and the captured hidden states."""

    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.k_cache: Tensor | None = None
        self.v_cache: Tensor | None = None
        self.capture_layers: tuple[int, ...] = ()

    def setup_caches(self, max_context: int, capture_layers: tuple[int, ...] = ()) -> None:
        """Allocate the KV cache and RoPE tables once, on the weights' device and dtype."""
        cfg, w = self.config, self.embed_tokens.weight
        shape = (cfg.num_hidden_layers, cfg.num_key_value_heads, max_context, cfg.head_dim)
        self.k_cache = torch.zeros(shape, device=w.device, dtype=w.dtype)
        self.v_cache = torch.zeros(shape, device=w.device, dtype=w.dtype)
        self.cos, self.sin = rope_tables(cfg.head_dim, cfg.rope_theta, max_context, w.device)
        self.capture_layers = capture_layers

    @property
    def max_context(self) -> int:
        return 0 if self.k_cache is None else self.k_cache.shape[2]

    def forward(
        self,
        tokens: Tensor,
        input_pos: Tensor,
        context_len: int,
        visibility: object | None,
        backend: Backend,
        capture: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """tokens, input_pos: [T] -> logits [T, V] (fp32), hidden [T, len(capture_layers) * hidden].

        The T new rows go to cache rows `context_len ..`; row i sees rows `[0, context_len)` and the
        new rows that `visibility` allows (None: causal).
        """
        if self.k_cache is None or self.v_cache is None:
            raise RuntimeError("call setup_caches(max_context) before forward")
        cos, sin = self.cos[input_pos], self.sin[input_pos]  # [T, D]
        x = self.embed_tokens(tokens)  # [T, hidden]
        captured: dict[int, Tensor] = {}
        for i, layer in enumerate(self.layers):
            h = layer.input_layernorm(x)
            x = x + layer.self_attn(
                h, cos, sin, self.k_cache[i], self.v_cache[i], context_len, visibility, backend
            )
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if capture and i in self.capture_layers:
                captured[i] = x
        x = self.norm(x)
        if len(self.layers) - 1 in captured:  # HF's last hidden_states entry is the normed output
            captured[len(self.layers) - 1] = x
        hidden = torch.cat([captured[i] for i in self.capture_layers], dim=-1) if captured else None
        return self.lm_head(x).float(), hidden
