"""The tiny MoE transformer of the reference server, tensor-parallel over a gloo group.

The shape follows the MoE models the product profiles (a dense first layer, then MoE layers with
routed experts, top-k routing and one shared expert), scaled down until a decode step takes a few
milliseconds on a CPU. Tensor parallelism is laid out as SGLang lays it out at TP (its
VocabParallelEmbedding, QKVParallelLinear, RowParallelLinear, FusedMoE in TP mode and
ParallelLMHead): every rank holds a slice of every weight, and the collectives are

    embedding:         all_reduce   (vocab-parallel lookup)
    per layer:         all_reduce after attention (o_proj is row-parallel)
                       all_reduce after the MLP / MoE (down projections are row-parallel)
    LM head:           all_gather   (vocab-parallel logits)

each a real torch.distributed call on gloo, so profiler traces show `gloo:all_reduce` per layer.

Weights are random but deterministic: each full tensor is drawn from a generator seeded with the
server seed and the tensor's name, and each rank keeps its slice, so any TP size computes the same
function (up to float summation order).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pcieprof.refserver.tokenizer import VOCAB_SIZE


@dataclass(frozen=True)
class TinyMoEConfig:
    """Architecture numbers of the `tiny-cpu` model (the reference server's only model).

    Attributes:
        vocab_size: tokenizer vocabulary (the LM head is padded to a multiple of 64).
        hidden_size: residual width; an all-reduce message is batch x hidden x 4 bytes (fp32).
        num_layers: transformer layers.
        first_k_dense: leading layers with a dense MLP instead of MoE.
        num_heads: attention heads (multi-head, no GQA), split across TP ranks.
        head_dim: per-head width.
        dense_intermediate: dense MLP width.
        num_experts: routed experts per MoE layer.
        experts_per_token: top-k of the router.
        moe_intermediate: width of each expert (split across TP ranks, as FusedMoE at TP).
        num_shared_experts: always-on experts per MoE layer.
        dtype: "float32" (CPU).
    """

    vocab_size: int = VOCAB_SIZE
    hidden_size: int = 256
    num_layers: int = 4
    first_k_dense: int = 1
    num_heads: int = 8
    head_dim: int = 32
    dense_intermediate: int = 512
    num_experts: int = 8
    experts_per_token: int = 2
    moe_intermediate: int = 128
    num_shared_experts: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    dtype: str = "float32"

    @property
    def padded_vocab_size(self) -> int:
        return ((self.vocab_size + 63) // 64) * 64

    def collectives_per_step(self) -> dict[str, int]:
        """Collectives of one forward step at TP > 1 (independent of the batch size)."""
        return {"all_reduce": 1 + 2 * self.num_layers, "all_gather": 1}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["architecture"] = "TinyMoeForCausalLM"
        data["padded_vocab_size"] = self.padded_vocab_size
        data["collectives_per_step"] = self.collectives_per_step()
        return data


class KVCache:
    """Keys and values of one request on one rank (its local heads only)."""

    def __init__(self, cfg: TinyMoEConfig, local_heads: int, capacity: int) -> None:
        shape = (cfg.num_layers, local_heads, capacity, cfg.head_dim)
        self.k = torch.zeros(shape)
        self.v = torch.zeros(shape)
        self.length = 0
        self.capacity = capacity


class TPGroup:
    """The tensor-parallel group: rank, size and the collectives the model calls."""

    def __init__(self, rank: int, size: int, group: Any = None) -> None:
        self.rank = rank
        self.size = size
        self.group = group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


def _full_weight(seed: int, name: str, shape: tuple[int, ...], fan_in: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    return torch.randn(shape, generator=gen) / math.sqrt(fan_in)


def _rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class TinyMoEModel:
    """One rank's shard of the model, with a batched forward over requests.

    Args:
        cfg: architecture.
        tp: this rank's tensor-parallel group.
        seed: weight seed (the server's --random-seed).
        max_positions: longest sequence (the server's --context-length).
    """

    def __init__(self, cfg: TinyMoEConfig, tp: TPGroup, seed: int, max_positions: int) -> None:
        if cfg.num_heads % tp.size or cfg.padded_vocab_size % tp.size:
            raise ValueError(f"tp_size {tp.size} does not divide the heads ({cfg.num_heads}) "
                             f"and padded vocabulary ({cfg.padded_vocab_size})")
        self.cfg = cfg
        self.tp = tp
        r, n = tp.rank, tp.size
        h, d = cfg.hidden_size, cfg.head_dim
        self.local_heads = cfg.num_heads // n
        hd_local = self.local_heads * d

        def rows(t: torch.Tensor, parts: int = 1) -> torch.Tensor:
            # Column-parallel: this rank's slice of the output features (of each fused part).
            chunks = t.chunk(parts, dim=0)
            return torch.cat([c.chunk(n, dim=0)[r] for c in chunks], dim=0).contiguous()

        def cols(t: torch.Tensor) -> torch.Tensor:
            # Row-parallel: this rank's slice of the input features.
            return t.chunk(n, dim=-1)[r].contiguous()

        vocab = cfg.padded_vocab_size
        self.vocab_start = r * vocab // n
        self.vocab_end = (r + 1) * vocab // n
        self.embed = rows(_full_weight(seed, "embed_tokens", (vocab, h), 1))
        self.lm_head = rows(_full_weight(seed, "lm_head", (vocab, h), h))
        self.layers: list[dict[str, torch.Tensor]] = []
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            layer = {
                "qkv": rows(_full_weight(seed, p + "qkv_proj", (3 * cfg.num_heads * d, h), h), 3),
                "o": cols(_full_weight(seed, p + "o_proj", (h, cfg.num_heads * d),
                                       cfg.num_heads * d)),
            }
            if i < cfg.first_k_dense:
                inter = cfg.dense_intermediate
                layer["gate_up"] = rows(_full_weight(seed, p + "mlp.gate_up", (2 * inter, h), h), 2)
                layer["down"] = cols(_full_weight(seed, p + "mlp.down", (h, inter), inter))
            else:
                inter = cfg.moe_intermediate
                e = cfg.num_experts
                layer["router"] = _full_weight(seed, p + "moe.gate", (e, h), h)
                w13 = _full_weight(seed, p + "moe.experts.w13", (e, 2 * inter, h), h)
                w2 = _full_weight(seed, p + "moe.experts.w2", (e, h, inter), inter)
                layer["w13"] = torch.stack([rows(w13[j], 2) for j in range(e)])
                layer["w2"] = torch.stack([cols(w2[j]) for j in range(e)])
                s_inter = inter * cfg.num_shared_experts
                layer["shared_gate_up"] = rows(
                    _full_weight(seed, p + "moe.shared.gate_up", (2 * s_inter, h), h), 2)
                layer["shared_down"] = cols(
                    _full_weight(seed, p + "moe.shared.down", (h, s_inter), s_inter))
            self.layers.append(layer)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        ang = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)
        self.cos, self.sin = ang.cos(), ang.sin()
        self.hd_local = hd_local

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(self.cfg, self.local_heads, capacity)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        # Rotate pairs (even, odd) of the last dim by position-dependent angles; `pos` indexes
        # the second-to-last dim of x (or broadcasts against it).
        cos, sin = self.cos[pos], self.sin[pos]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x1 * sin + x2 * cos
        return out

    def _attention(self, li: int, x: torch.Tensor, segs: list[tuple[int, int]],
                   caches: list[KVCache]) -> torch.Tensor:
        layer = self.layers[li]
        qkv = x @ layer["qkv"].T
        q_all, k_all, v_all = qkv.split(self.hd_local, dim=-1)
        if all(n == 1 for _, n in segs):
            out = self._decode_attention(li, q_all, k_all, v_all, segs, caches)
        else:
            out = self._extend_attention(li, q_all, k_all, v_all, segs, caches)
        return self.tp.all_reduce(out @ layer["o"].T)

    def _decode_attention(self, li: int, q_all: torch.Tensor, k_all: torch.Tensor,
                          v_all: torch.Tensor, segs: list[tuple[int, int]],
                          caches: list[KVCache]) -> torch.Tensor:
        # One new token per request: rotate all at once, then attend over a padded batch of
        # the requests' caches (one SDPA call per layer instead of one per request).
        d, hl, b = self.cfg.head_dim, self.local_heads, len(segs)
        pos = torch.tensor([start for start, _ in segs])
        q = self._rope(q_all.view(b, hl, d), pos.view(b, 1))
        k = self._rope(k_all.view(b, hl, d), pos.view(b, 1))
        v = v_all.view(b, hl, d)
        lengths = pos + 1
        lmax = int(lengths.max())
        keys = torch.zeros(b, hl, lmax, d)
        values = torch.zeros(b, hl, lmax, d)
        for i, ((start, _), cache) in enumerate(zip(segs, caches)):
            cache.k[li, :, start] = k[i]
            cache.v[li, :, start] = v[i]
            keys[i, :, :start + 1] = cache.k[li, :, :start + 1]
            values[i, :, :start + 1] = cache.v[li, :, :start + 1]
        mask = (torch.arange(lmax).view(1, lmax) < lengths.view(b, 1)).view(b, 1, 1, lmax)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=mask)
        return o.reshape(b, hl * d)

    def _extend_attention(self, li: int, q_all: torch.Tensor, k_all: torch.Tensor,
                          v_all: torch.Tensor, segs: list[tuple[int, int]],
                          caches: list[KVCache]) -> torch.Tensor:
        d, hl = self.cfg.head_dim, self.local_heads
        outs = []
        offset = 0
        for (start, n), cache in zip(segs, caches):
            sl = slice(offset, offset + n)
            offset += n
            pos = torch.arange(start, start + n)
            q = self._rope(q_all[sl].view(n, hl, d).transpose(0, 1), pos)
            k = self._rope(k_all[sl].view(n, hl, d).transpose(0, 1), pos)
            cache.k[li, :, start:start + n] = k
            cache.v[li, :, start:start + n] = v_all[sl].view(n, hl, d).transpose(0, 1)
            keys, values = cache.k[li, :, :start + n], cache.v[li, :, :start + n]
            if n == 1:
                o = F.scaled_dot_product_attention(q, keys, values)
            elif start == 0:
                o = F.scaled_dot_product_attention(q, keys, values, is_causal=True)
            else:  # extend on top of a prefix: causal with an offset
                mask = torch.ones(n, start + n, dtype=torch.bool).tril(diagonal=start)
                o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            outs.append(o.transpose(0, 1).reshape(n, hl * d))
        return torch.cat(outs, dim=0)

    def _mlp_partial(self, li: int, x: torch.Tensor) -> torch.Tensor:
        layer = self.layers[li]
        if "gate_up" in layer:
            g, u = (x @ layer["gate_up"].T).chunk(2, dim=-1)
            return (F.silu(g) * u) @ layer["down"].T
        cfg = self.cfg
        probs = torch.softmax(x @ layer["router"].T, dim=-1)
        weights, experts = probs.topk(cfg.experts_per_token, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in experts.unique().tolist():
            tok, slot = (experts == e).nonzero(as_tuple=True)
            g, u = (x[tok] @ layer["w13"][e].T).chunk(2, dim=-1)
            y = (F.silu(g) * u) @ layer["w2"][e].T
            out.index_add_(0, tok, y * weights[tok, slot].unsqueeze(-1))
        g, u = (x @ layer["shared_gate_up"].T).chunk(2, dim=-1)
        return out + (F.silu(g) * u) @ layer["shared_down"].T

    @torch.inference_mode()
    def forward(self, token_ids: list[int], segs: list[tuple[int, int]], caches: list[KVCache],
                poison: bool = False) -> torch.Tensor:
        """Run one step for a batch of requests.

        Args:
            token_ids: the new tokens of all requests, concatenated.
            segs: per request (start position, number of new tokens), in the same order.
            caches: per request, its KV cache; advanced by the new tokens.
            poison: fault injection: the last layer's partial MoE output becomes NaN on this
                rank before its all-reduce, so every rank's logits are NaN.

        Returns:
            Logits of the last new token of each request, [requests, vocab_size] (full vocab
            on every rank).
        """
        cfg = self.cfg
        ids = torch.tensor(token_ids, dtype=torch.long)
        local = (ids >= self.vocab_start) & (ids < self.vocab_end)
        x = self.embed[(ids - self.vocab_start).clamp(0, self.embed.shape[0] - 1)]
        x = self.tp.all_reduce(x * local.unsqueeze(-1))
        for li in range(cfg.num_layers):
            x = x + self._attention(li, _rms_norm(x, cfg.rms_norm_eps), segs, caches)
            partial = self._mlp_partial(li, _rms_norm(x, cfg.rms_norm_eps))
            if poison and li == cfg.num_layers - 1:
                partial.fill_(float("nan"))
            x = x + self.tp.all_reduce(partial)
        for (start, n), cache in zip(segs, caches):
            cache.length = start + n
        last = torch.tensor([0] + [n for _, n in segs]).cumsum(0)[1:] - 1
        h = _rms_norm(x[last], cfg.rms_norm_eps)
        logits = self.tp.all_gather_last_dim(h @ self.lm_head.T)
        return logits[:, :cfg.vocab_size]
