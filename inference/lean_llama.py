"""A lean forward pass for Llama-architecture models, for batched decoding with a static KV cache.

On small models a Hugging Face forward spends most of its time in Python: module calls, mask
building, a cache that concatenates its keys and values at every token. Decoding calls it once
per generated token, so for the tiny models this project trains (and any small policy on a CPU)
that overhead, not the arithmetic, sets the rollout speed. `LeanLlama` runs the same
computation in a few tensor operations per layer: the query, key and value projections as one
matrix product, the gate and up projections as another, RMSNorm as one fused call, the rotary
tables computed once, and keys and values written into a preallocated cache instead of being
concatenated.

It is the same function as the model's own forward (tests/test_lean_llama.py compares logits
and greedy generations), and it applies only where that is certain: a plain `LlamaForCausalLM`
(no adapters or wrappers, no rope scaling, no biases, SiLU, no tensor-parallel split, no
autocast); `lean_llama(model)` returns None for anything else and the caller uses the model as
is. The weights are read when the decoder is made, so make one per generation call (a learner
changes them every step).

Learners keep the model's own forward for their log-probs: that pass is arithmetic-bound, and a
second implementation there would differ from a DDP-wrapped learner's (which must run through
its wrapper) by float rounding that Adam amplifies on near-zero gradients.
"""

import torch
from torch.nn import functional as fn
from transformers import LlamaForCausalLM


def lean_llama(model: torch.nn.Module) -> "LeanLlama | None":
    """A `LeanLlama` for `model` when it is a plain Llama the lean path computes exactly, else None."""
    if type(model) is not LlamaForCausalLM or getattr(model, "_original_forward", None) is not None:
        return None  # a subclass, a wrapper, or a forward Accelerate wrapped (mixed-precision autocast)
    if torch.is_autocast_enabled(model.device.type):
        return None
    config = model.config
    rope = getattr(config, "rope_parameters", None) or {}
    plain = (
        rope.get("rope_type", "default") == "default"
        and "rope_theta" in rope
        and not getattr(config, "attention_bias", False)
        and not getattr(config, "mlp_bias", False)
        and getattr(config, "hidden_act", "silu") == "silu"
        and getattr(config, "pretraining_tp", 1) == 1
        and (getattr(config, "attention_dropout", 0.0) == 0.0 or not model.training)
        and isinstance(model.get_output_embeddings(), torch.nn.Linear)  # not int8-quantised
        and model.get_output_embeddings().bias is None
    )
    return LeanLlama(model) if plain else None


class LeanLlama:
    """Prefill and decode steps over a static cache of `capacity` positions per row.

    Rows are left-padded: every row has the same number of cached positions, the padding masked
    out by `key_mask` (True where a real token stands)."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads or self.heads  # LlamaConfig's own default
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.hidden = config.hidden_size
        base = model.model
        self.embed = base.embed_tokens.weight
        self.layers = [
            (
                layer.input_layernorm.weight,
                torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight]),
                layer.self_attn.o_proj.weight,
                layer.post_attention_layernorm.weight,
                torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]),
                layer.mlp.down_proj.weight,
            )
            for layer, attention in ((layer, layer.self_attn) for layer in base.layers)
        ]
        self.norm = base.norm.weight
        self.lm_head = model.get_output_embeddings().weight
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        rope = config.rope_parameters
        theta = rope.get("rope_theta") if isinstance(rope, dict) else None
        if theta is None:  # lean_llama made sure it is there
            raise ValueError("the lean path needs the model config's rope_parameters.rope_theta")
        steps = torch.arange(0, self.head_dim, 2, dtype=torch.float, device=self.device)
        self.inv_freq = 1.0 / (theta ** (steps / self.head_dim))
        kv_width = self.kv_heads * self.head_dim
        self.split = (self.heads * self.head_dim, kv_width, kv_width)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.length = 0
        self.capacity: int | None = None  # positions per row that reserve() allocated; None: not yet

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq
        table = torch.cat((freqs, freqs), dim=-1)
        return table.cos().to(self.dtype)[:, None], table.sin().to(self.dtype)[:, None]

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor
    ) -> torch.Tensor:
        """The last position's logits (float32) after running `input_ids` (B, T) at `positions`,
        the new keys and values appended to the cache; `key_mask` (B, cached + T) marks real tokens."""
        batch, width = input_ids.shape
        start, end = self.length, self.length + width
        cos, sin = self._rotary(positions)
        # Causal within the new tokens, padding masked; each position always sees itself, so a
        # padding query never attends to nothing (its output is never used).
        allowed = key_mask[:, None, None, :end]
        if width > 1:
            causal = torch.ones(width, end, dtype=torch.bool, device=self.device).tril(start)
            own = torch.zeros_like(causal)
            own[:, start:] = torch.eye(width, dtype=torch.bool, device=self.device)
            allowed = (allowed & causal) | own
        x = fn.embedding(input_ids, self.embed)
        half = self.head_dim // 2
        for index, (norm_in, qkv, out, norm_post, gate_up, down) in enumerate(self.layers):
            h = fn.rms_norm(x, (self.hidden,), norm_in, self.eps)
            q, k, v = fn.linear(h, qkv).split(self.split, dim=-1)
            q = q.view(batch, width, self.heads, self.head_dim).transpose(1, 2)
            k = k.view(batch, width, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(batch, width, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin
            k = k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin
            self.keys[index][:, :, start:end] = k
            self.values[index][:, :, start:end] = v
            attended = fn.scaled_dot_product_attention(
                q,
                self.keys[index][:, :, :end],
                self.values[index][:, :, :end],
                attn_mask=allowed,
                enable_gqa=self.kv_heads != self.heads,
            )
            x = x + fn.linear(attended.transpose(1, 2).reshape(batch, width, -1), out)
            h = fn.rms_norm(x, (self.hidden,), norm_post, self.eps)
            gate, up = fn.linear(h, gate_up).chunk(2, dim=-1)
            x = x + fn.linear(fn.silu(gate) * up, down)
        self.length = end
        last = fn.rms_norm(x[:, -1], (self.hidden,), self.norm, self.eps)
        return fn.linear(last, self.lm_head).float()

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, capacity: int) -> torch.Tensor:
        """Start a cache of `capacity` positions with left-padded prompts; the last position's logits."""
        batch = input_ids.size(0)
        shape = (batch, self.kv_heads, capacity, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.length = 0
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        return self.forward(input_ids, positions, attention_mask.bool())

    def reserve(self, batch: int, capacity: int) -> None:
        """A preallocated cache of at least `capacity` positions per row for `batch` rows, the
        positions already cached kept (a conversation that grows a turn at a time:
        inference/sessions.py); without a cache yet, an empty one."""
        if self.capacity is not None and capacity <= self.capacity:
            return
        shape = (batch, self.kv_heads, capacity, self.head_dim)
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        if self.capacity is not None and self.length:
            for new, old in zip(keys + values, self.keys + self.values, strict=True):
                new[:, :, : self.length] = old[:, :, : self.length]
        else:
            self.length = 0
        self.keys, self.values, self.capacity = keys, values, capacity

    def select(self, rows: torch.Tensor) -> None:
        """Keep the cache rows `rows` (in that order; a row may repeat)."""
        self.keys = [keys[rows] for keys in self.keys]
        self.values = [values[rows] for values in self.values]
