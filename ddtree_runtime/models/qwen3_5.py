"""Qwen3.5 / Qwen3.6 hybrid decoder: Gated DeltaNet layers between gated full-attention layers.

As transformers' `qwen3_5` defines it: RMSNorms scale by (1 + weight); full attention has a sigmoid
output gate (the second half of each q_proj head), q/k norms and RoPE on the first
`partial_rotary_factor` of each head; Gated DeltaNet layers project q, k, v through a short causal
conv1d + silu, decay by g = -exp(A_log) softplus(a + dt_bias), write with beta = sigmoid(b), and
leave through a gated RMSNorm (silu(z)) and `out_proj`.

State per sequence: the full-attention layers' KV cache (static, written by row as in `Qwen3`), and
per Gated DeltaNet layer a conv state (the last K-1 conv inputs) and a recurrent state [Hv, Dk, Dv]
in fp32. `forward` without `parents` is a committed chain (prefill, `ar`): it advances the states.
With `parents` it verifies a tree (a chain is a tree too): every node reads the states along its
own root path (`models/gdn.py`), nothing is advanced, and `commit` then moves the states along the
accepted path from what the pass kept, with no second target pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddtree_runtime.backend import TorchBackend
from ddtree_runtime.config import Qwen3_5Config
from ddtree_runtime.models.gdn import advance_state, conv_windows, gdn_chain, tree_conv
from ddtree_runtime.models.qwen3 import MLP, apply_rope, as_device_length, outputs, rope_tables


class RMSNorm(nn.Module):
    """Qwen3.5's RMSNorm: weights stored around zero and applied as (1 + weight), in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """RMSNorm of the DeltaNet output, times silu(z)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * xf.to(x.dtype) * F.silu(z.float())).to(x.dtype)


def partial_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [H, T, D]; RoPE on the first cos.shape[-1] dims, the rest passes through."""
    r = cos.shape[-1]
    return torch.cat([apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)


class GatedAttention(nn.Module):
    def __init__(self, cfg: Qwen3_5Config) -> None:
        super().__init__()
        d, bias = cfg.head_dim, cfg.attention_bias
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * d * 2, bias=bias)  # query | gate per head
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * d, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * d, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        context_len: Tensor,
        visibility: object | None,
        backend: TorchBackend,
        key_bound: int,
    ) -> Tensor:
        # x: [T, hidden]; cos, sin: [T, rotary_dim]; k_cache, v_cache: [Hkv, S_max, D] (this layer);
        # context_len: 0-d device tensor, key_bound: the most keys it can reach
        t, d = x.shape[0], self.head_dim
        q, gate = self.q_proj(x).view(t, self.n_heads, 2 * d).split(d, dim=-1)  # [T, Hq, D] each
        q = partial_rope(self.q_norm(q).transpose(0, 1), cos, sin)  # [Hq, T, D]
        k = partial_rope(self.k_norm(self.k_proj(x).view(t, self.n_kv, d)).transpose(0, 1), cos, sin)
        rows = context_len + torch.arange(t, device=x.device)
        k_cache.index_copy_(1, rows, k)
        v_cache.index_copy_(1, rows, self.v_proj(x).view(t, self.n_kv, d).transpose(0, 1))
        out = backend.attention(q, k_cache, v_cache, context_len, visibility, d**-0.5, key_bound=key_bound)
        out = out.transpose(0, 1).reshape(t, -1) * torch.sigmoid(gate.reshape(t, -1))
        return self.o_proj(out)


@dataclass
class Staged:
    """What a verify pass keeps per DeltaNet layer so that `commit` can advance its states."""

    windows: Tensor  # [N, K] conv rows of cat(conv_state, x)
    x: Tensor  # [N, C] conv inputs
    k: Tensor  # [Hv, N, Dk]
    d: Tensor  # [Hv, N, Dv]
    big_g: Tensor  # [Hv, N]


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: Qwen3_5Config) -> None:
        super().__init__()
        self.n_k, self.n_v = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        key_dim, value_dim = self.n_k * self.dk, self.n_v * self.dv
        self.conv_dim = 2 * key_dim + value_dim
        self.kernel = cfg.linear_conv_kernel_dim
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, self.n_v, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, self.n_v, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.n_v))
        self.A_log = nn.Parameter(torch.zeros(self.n_v))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(value_dim, cfg.hidden_size, bias=False)

    def forward(
        self, x: Tensor, conv_state: Tensor, state: Tensor, parents: Tensor | None, backend: TorchBackend
    ) -> tuple[Tensor, Staged | None]:
        """x: [T, hidden]; conv_state: [K-1, C]; state: [Hv, Dk, Dv] fp32, both of this layer.
        A chain (parents None) updates both states in place; a tree leaves them and returns Staged."""
        t = x.shape[0]
        mixed = self.in_proj_qkv(x)  # [T, C]
        chain = torch.arange(-1, t - 1, device=x.device) if parents is None else parents
        windows = conv_windows(chain, self.kernel)
        qkv = tree_conv(mixed, conv_state, self.conv1d.weight[:, 0], windows).float()
        q, k, v = qkv.split([self.n_k * self.dk, self.n_k * self.dk, self.n_v * self.dv], dim=-1)
        rep = self.n_v // self.n_k
        q = F.normalize(q.view(t, self.n_k, self.dk), dim=-1, eps=1e-6)  # l2norm, as transformers
        k = F.normalize(k.view(t, self.n_k, self.dk), dim=-1, eps=1e-6)
        q = q.repeat_interleave(rep, dim=1).transpose(0, 1) * self.dk**-0.5  # [Hv, T, Dk]
        k = k.repeat_interleave(rep, dim=1).transpose(0, 1)
        v = v.view(t, self.n_v, self.dv).transpose(0, 1)  # [Hv, T, Dv]
        beta = torch.sigmoid(self.in_proj_b(x).float()).t()  # [Hv, T]
        g = (-self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float())).t()
        staged = None
        if parents is None:
            o, new_state = gdn_chain(q, k, v, g, beta, state)
            conv_state.copy_(torch.cat([conv_state, mixed.to(conv_state.dtype)])[-(self.kernel - 1) :])
            state.copy_(new_state)
        else:
            o, d, big_g = backend.gdn_tree(q, k, v, g, beta, parents, state)
            staged = Staged(windows, mixed, k, d, big_g)
        o = o.transpose(0, 1).to(x.dtype)  # [T, Hv, Dv]
        z = self.in_proj_z(x).view(t, self.n_v, self.dv)
        return self.out_proj(self.norm(o, z).reshape(t, -1)), staged

    @staticmethod
    def commit(conv_state: Tensor, state: Tensor, staged: Staged, path: Tensor, path_len: Tensor) -> None:
        """Advance both states along the accepted path (path [N] padded with -1, path_len 0-d)."""
        last = path.gather(0, (path_len - 1).reshape(1))
        hist = torch.cat([conv_state, staged.x.to(conv_state.dtype)])
        new_conv = hist[staged.windows[last, 1:].reshape(-1)]
        state.copy_(advance_state(state, staged.k, staged.d, staged.big_g, path, path_len))
        conv_state.copy_(new_conv)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3_5Config, kind: str) -> None:
        super().__init__()
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = GatedAttention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen3_5(nn.Module):
    """The hybrid target. `forward` returns logits and the captured hidden states, as `Qwen3`."""

    def __init__(self, cfg: Qwen3_5Config) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, kind) for kind in cfg.layer_types)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.k_cache: Tensor | None = None
        self.v_cache: Tensor | None = None
        self.capture_layers: tuple[int, ...] = ()
        self.slot = {layer: i for i, layer in enumerate(cfg.full_layers)}
        self.slot.update({layer: i for i, layer in enumerate(cfg.linear_layers)})
        self.staged: dict[int, Staged] = {}

    def fuse(self) -> None:
        """Fused gate/up projections for inference (done by the loader; training keeps HF's)."""
        for layer in self.layers:
            layer.mlp.fuse()

    def setup_caches(self, max_context: int, capture_layers: tuple[int, ...] = ()) -> None:
        """KV cache of the full-attention layers, conv + recurrent states of the DeltaNet layers."""
        cfg, w = self.config, self.embed_tokens.weight
        shape = (len(cfg.full_layers), cfg.num_key_value_heads, max_context, cfg.head_dim)
        self.k_cache = torch.zeros(shape, device=w.device, dtype=w.dtype)
        self.v_cache = torch.zeros(shape, device=w.device, dtype=w.dtype)
        n_lin = len(cfg.linear_layers)
        conv_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
        conv_dim += cfg.linear_num_value_heads * cfg.linear_value_head_dim
        self.conv_state = torch.zeros(
            n_lin, cfg.linear_conv_kernel_dim - 1, conv_dim, device=w.device, dtype=w.dtype
        )
        self.rec_state = torch.zeros(
            n_lin,
            cfg.linear_num_value_heads,
            cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
            device=w.device,
            dtype=torch.float32,
        )
        self.cos, self.sin = rope_tables(cfg.rotary_dim, cfg.rope_theta, max_context, w.device)
        self.capture_layers = capture_layers
        self.staged = {}

    @property
    def max_context(self) -> int:
        return 0 if self.k_cache is None else self.k_cache.shape[2]

    def reset(self) -> None:
        """Zero the recurrent and conv states before a new sequence (the KV rows are overwritten)."""
        self.conv_state.zero_()
        self.rec_state.zero_()
        self.staged = {}

    def forward(
        self,
        tokens: Tensor,
        input_pos: Tensor,
        context_len: int | Tensor,
        visibility: object | None,
        backend: TorchBackend,
        capture: bool = True,
        *,
        key_bound: int | None = None,
        logits_dtype: torch.dtype | None = torch.float32,
        last_logits_only: bool = False,
        parents: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """tokens, input_pos: [T] -> logits [T, V], hidden [T, len(capture_layers) * hidden].

        Without `parents` the T tokens extend the committed sequence (a fresh sequence when
        `context_len` is 0). With `parents` they are a tree to verify; call `commit` afterwards.
        `context_len`, `key_bound`, `logits_dtype` and `last_logits_only` are as for `Qwen3`.
        """
        if self.k_cache is None or self.v_cache is None:
            raise RuntimeError("call setup_caches(max_context) before forward")
        if isinstance(context_len, int) and context_len == 0:
            self.reset()
        if key_bound is None:
            key_bound = int(context_len) + tokens.shape[0]
        context_len = as_device_length(context_len, tokens.device)
        cos, sin = self.cos[input_pos], self.sin[input_pos]  # [T, rotary_dim]
        x = self.embed_tokens(tokens)  # [T, hidden]
        captured: dict[int, Tensor] = {}
        self.staged = {}
        for i, layer in enumerate(self.layers):
            h, s = layer.input_layernorm(x), self.slot[i]
            if hasattr(layer, "linear_attn"):
                out, staged = layer.linear_attn(h, self.conv_state[s], self.rec_state[s], parents, backend)
                if staged is not None:
                    self.staged[s] = staged
            else:
                out = layer.self_attn(
                    h, cos, sin, self.k_cache[s], self.v_cache[s], context_len, visibility, backend, key_bound
                )
            x = x + out
            x = x + layer.mlp(layer.post_attention_layernorm(x), backend)
            if capture and i in self.capture_layers:
                captured[i] = x
        return outputs(self, self.norm(x), captured, logits_dtype, last_logits_only)

    def commit(
        self, context_len: int | Tensor, path: Tensor, path_len: Tensor, backend: TorchBackend, chain: bool
    ) -> None:
        """After a verify pass: the DeltaNet states along the accepted path, then (for a tree) the
        accepted K/V rows into place, as for dense models. path [N] padded with -1; path_len 0-d."""
        for s, staged in self.staged.items():
            GatedDeltaNet.commit(self.conv_state[s], self.rec_state[s], staged, path, path_len)
        self.staged = {}
        if not chain:
            backend.compact(self.k_cache, self.v_cache, context_len, path, path_len)
