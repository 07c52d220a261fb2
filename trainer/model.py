"""A GPT: pre-norm blocks, rotary positions, SDPA attention, tied input/output embeddings.

With `position_ids` that restart at each document (the loader's `position_ids=True`), RoPE uses them
and attention is document-causal: a token sees only earlier tokens of its own document.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import ModelConfig


WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "module.")


def canonical_name(name: str) -> str:
    """A parameter's name in the plain GPT: without the prefixes of activation checkpointing, compile and DDP."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def padded_vocab(vocab_size: int, multiple: int) -> int:
    return -(-vocab_size // multiple) * multiple


class Rotary(nn.Module):
    """cos/sin tables of rotary embeddings, looked up by position."""

    def __init__(self, head_dim: int, max_len: int, theta: float):
        super().__init__()
        self.head_dim, self.max_len, self.theta = head_dim, max_len, theta
        self.register_buffer("cos", torch.empty(max_len, head_dim // 2), persistent=False)
        self.register_buffer("sin", torch.empty(max_len, head_dim // 2), persistent=False)
        self.reset_tables()

    def reset_tables(self) -> None:
        """(Re)compute the tables; needed after the module leaves the meta device."""
        if self.cos.is_meta:
            return
        inv = 1.0 / self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32,
                                                device=self.cos.device) / self.head_dim)
        angles = torch.outer(torch.arange(self.max_len, dtype=torch.float32, device=self.cos.device), inv)
        self.cos.copy_(angles.cos())
        self.sin.copy_(angles.sin())

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (T,) or (B, T) -> cos, sin broadcastable to (B, H, T, head_dim/2)."""
        cos, sin = self.cos[positions], self.sin[positions]
        if positions.dim() == 2:
            return cos[:, None], sin[:, None]
        return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


def document_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) positions restarting at 0 per document -> (B, 1, T, T) bool, True where attention is allowed."""
    doc = (position_ids == 0).cumsum(dim=1)
    same = doc[:, :, None] == doc[:, None, :]
    T = position_ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=position_ids.device).tril()
    return (same & causal)[:, None]


QKV_LAYOUT = "per-head"  # qkv's rows: head by head, each its q, k, v (Megatron's), so a row split keeps whole heads


class Attention(nn.Module):
    """Causal self-attention. The fused qkv projection's rows are grouped by head, so tensor parallelism (a split
    of its rows over ranks) gives each rank whole heads: the head count is read from the local output."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim, self.dropout = cfg.d_model // cfg.n_head, cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        B, T, _ = x.shape
        qkv = self.qkv(x)
        heads = qkv.shape[-1] // (3 * self.head_dim)  # this rank's heads: all of them without tensor parallelism
        q, k, v = qkv.view(B, T, heads, 3, self.head_dim).permute(3, 0, 2, 1, 4)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(B, T, heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = int(cfg.mlp_ratio * cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, hidden, bias=False)
        self.proj = nn.Linear(hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.norm2 = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x), cos, sin, mask))
        return x + self.drop(self.mlp(self.norm2(x)))


class GPT(nn.Module):
    """Decoder-only transformer; `forward(input_ids, labels)` returns the mean token loss."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, max_len: int):
        super().__init__()
        self.cfg, self.vocab_size, self.max_len = cfg, vocab_size, max_len
        self.padded_vocab = padded_vocab(vocab_size, cfg.vocab_multiple)
        self.tok_emb = nn.Embedding(self.padded_vocab, cfg.d_model)
        # a dict by layer number: a pipeline stage keeps its layers under their full model's names (blocks.N)
        self.blocks = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.n_layer)})
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, self.padded_vocab, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied: one matrix reads and writes tokens
        self.rotary = Rotary(cfg.d_model // cfg.n_head, max_len, cfg.rope_theta)
        self.full_params: int | None = None  # a pipeline stage's: the whole model's parameter count

    def tie_weights(self) -> None:
        """Re-tie after `to_empty()`, which gives each module its own copy of a shared parameter. A pipeline stage
        holds one end only (or, with one stage... both): its copy is kept equal by the trainer."""
        if self.tok_emb is not None and self.lm_head is not None and self.lm_head.weight is not self.tok_emb.weight:
            self.lm_head.weight = self.tok_emb.weight

    def keep_stage(self, stage: int, stages: int) -> None:
        """Become pipeline stage `stage` of `stages`: its layers (by number, names kept), the embedding on the first,
        the final norm and lm_head on the last (its own copy of the tied matrix, whose gradient the trainer
        all-reduces with the first stage's)."""
        self.full_params = self.num_params()
        per = self.cfg.n_layer // stages
        for i in list(self.blocks):
            if not stage * per <= int(i) < (stage + 1) * per:
                del self.blocks[i]
        if stage > 0:
            self.tok_emb = None
        if stage < stages - 1:
            self.norm = self.lm_head = None
        elif stage > 0:
            self.lm_head.weight = nn.Parameter(torch.empty_like(self.lm_head.weight))

    def num_params(self) -> int:
        """Parameters of the whole model (a pipeline stage's count the whole model's)."""
        return self.full_params or sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6N for the weights plus 12*L*H*Q*T for attention (PaLM, appendix B)."""
        c = self.cfg
        return 6.0 * self.num_params() + 12.0 * c.n_layer * c.n_head * (c.d_model // c.n_head) * seq_len

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Seeded init, one generator per parameter seeded by its name in the full model, so every rank, every
        sharding and every layout (whichever parameters a rank holds) starts from the 1-process model's weights.

        Sharded (DTensor) parameters are generated whole on their device and each rank keeps its shard.
        Output projections are scaled by 1/sqrt(2 * n_layer) (GPT-2) to keep the residual stream's variance.
        """
        self.rotary.reset_tables()
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            name = canonical_name(name)
            name = "tok_emb.weight" if name == "lm_head.weight" else name  # a last stage's copy of the tied matrix
            local = p.to_local() if hasattr(p, "to_local") else p
            gen = torch.Generator(device=local.device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            full = torch.empty(p.shape, dtype=p.dtype, device=local.device)
            if "norm" in name:
                full.fill_(1.0)
            else:
                scale = 1.0 / math.sqrt(2 * self.cfg.n_layer) if name.endswith("proj.weight") else 1.0
                full.normal_(0.0, std * scale, generator=gen)
            if hasattr(p, "to_local"):
                from torch.distributed.tensor import distribute_tensor

                full = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
            local.copy_(full)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids (or, on a pipeline stage after the first, the hidden states) -> the mean token loss with
        `labels`, else the logits (a stage before the last: its hidden states)."""
        T = input_ids.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence of {T} tokens is longer than the model's {self.max_len}")
        if position_ids is None:
            cos, sin = self.rotary(torch.arange(T, device=input_ids.device))
            mask = None
        else:
            cos, sin = self.rotary(position_ids)
            mask = document_mask(position_ids)
        x = self.tok_emb(input_ids) if self.tok_emb is not None else input_ids
        for block in self.blocks.values():
            x = block(x, cos, sin, mask)
        if self.lm_head is None:
            return x
        logits = self.lm_head(self.norm(x))
        if labels is None:
            return logits if self.full_params else logits[..., : self.vocab_size]
        return token_loss(logits, labels)


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy over the (padded) vocabulary's logits, in fp32."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))
