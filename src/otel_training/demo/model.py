"""A small GPT-style decoder over bytes, with an optional mixture-of-experts MLP.

Token and learned position embeddings, pre-LayerNorm blocks with causal self-attention
(``torch.nn.functional.scaled_dot_product_attention``), a GELU MLP or a top-k routed mixture of
experts, a final LayerNorm and an output head tied to the token embedding.

Module names are stable so that observers can hook them: ``blocks.{i}.attn``,
``blocks.{i}.mlp`` and, with MoE, ``blocks.{i}.mlp.router`` (an ``nn.Linear`` whose output is the
router logits ``[T, E]``) and ``blocks.{i}.mlp.experts.{e}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPT", "GPTConfig", "MoE"]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the model.

    Attributes:
        vocab_size: tokens in the vocabulary (256 for bytes).
        seq_len: maximum sequence length (positions).
        n_layers: transformer blocks.
        d_model: hidden size; must be divisible by ``n_heads``.
        n_heads: attention heads.
        mlp_ratio: MLP hidden size / ``d_model``.
        moe: replace each block's MLP with a mixture of experts.
        n_experts: experts per MoE layer, ``E``.
        top_k: experts per token, ``k``.
    """

    vocab_size: int = 256
    seq_len: int = 128
    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    mlp_ratio: int = 4
    moe: bool = False
    n_experts: int = 4
    top_k: int = 2

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by heads {self.n_heads}")
        if self.moe and not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k must be in [1, {self.n_experts}], got {self.top_k}")
        for name in ("vocab_size", "seq_len", "n_layers", "d_model", "n_heads", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: ``x[B, S, d] -> y[B, S, d]``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        q, k, v = self.qkv(x).split(d_model, dim=-1)
        # [B, S, d] -> [B, H, S, d / H]
        q, k, v = (t.view(batch, seq, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, d_model))


class MLP(nn.Module):
    """GELU feed-forward: ``x[..., d] -> y[..., d]`` through ``mlp_ratio * d`` hidden units."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, hidden)
        self.proj = nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class MoE(nn.Module):
    """Top-k routed mixture of GELU experts with a Switch-style load-balancing loss.

    The router is ``self.router``, an ``nn.Linear(d, E, bias=False)``; its output
    ``logits[T, E]`` (T = B * S tokens) can be observed with a forward hook. Each token goes to
    its ``k`` highest-probability experts, weighted by their softmax probabilities renormalised
    over the ``k``. After each forward pass ``self.aux_loss`` holds the load-balancing loss
    ``E * sum_e f_e * P_e`` (Fedus et al. 2021, "Switch Transformers", eq. 4, generalised to
    top-k): ``f_e`` is the fraction of the ``T * k`` routing assignments that went to expert
    ``e`` and ``P_e`` the mean router probability of ``e``; it is 1.0 when the load is uniform.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_experts = config.n_experts
        self.top_k = config.top_k
        self.router = nn.Linear(config.d_model, config.n_experts, bias=False)
        hidden = config.mlp_ratio * config.d_model
        self.experts = nn.ModuleList(MLP(config.d_model, hidden) for _ in range(config.n_experts))
        self.aux_loss: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])  # [T, d]
        logits = self.router(tokens)  # [T, E]
        probs = logits.float().softmax(dim=-1)
        top_probs, top_experts = probs.topk(self.top_k, dim=-1)  # [T, k]
        weights = (top_probs / top_probs.sum(dim=-1, keepdim=True)).to(tokens.dtype)

        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            # An expert that no token chose still runs on its empty batch: its parameters stay
            # in the autograd graph with zero gradients, which DistributedDataParallel needs.
            token_idx, slot = (top_experts == e).nonzero(as_tuple=True)
            y = expert(tokens[token_idx]) * weights[token_idx, slot, None]
            out.index_add_(0, token_idx, y)

        assigned = F.one_hot(top_experts, self.n_experts).sum(dim=(0, 1)).float()  # [E]
        fraction = assigned / assigned.sum()
        self.aux_loss = self.n_experts * (fraction * probs.mean(dim=0)).sum()
        return out.reshape(shape)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln_mlp = nn.LayerNorm(config.d_model)
        self.mlp: nn.Module = (
            MoE(config) if config.moe else MLP(config.d_model, config.mlp_ratio * config.d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


class GPT(nn.Module):
    """Decoder-only transformer: ``idx[B, S]`` int64 -> ``logits[B, S, V]``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # tied output head
        self.apply(self._init_weights)
        # GPT-2 style: scale residual projections by 1 / sqrt(2 * layers).
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * config.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        _, seq = idx.shape
        if seq > self.config.seq_len:
            raise ValueError(f"sequence of {seq} tokens exceeds seq_len {self.config.seq_len}")
        pos = torch.arange(seq, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def aux_loss(self) -> torch.Tensor | None:
        """Mean MoE load-balancing loss of the last forward pass over layers; ``None`` if dense."""
        losses = [
            m.aux_loss for m in self.modules() if isinstance(m, MoE) and m.aux_loss is not None
        ]
        if not losses:
            return None
        return torch.stack(losses).mean()

    def active_non_embedding_params(self) -> int:
        """Parameters used per token outside the embeddings (with MoE, ``k`` of ``E`` experts).

        The tied output head is not counted (it is the token embedding); position embeddings are
        not counted. This is ``N`` of `otel_training.metrics.throughput.gpt_flops_per_token`.
        """
        total = 0
        for name, param in self.named_parameters():
            if name.startswith(("tok_emb.", "pos_emb.")):
                continue
            if ".experts." in name:
                total += param.numel() * self.config.top_k // self.config.n_experts
            else:
                total += param.numel()
        return total
