"""A lean forward pass for Llama-architecture models (Llama, Qwen2), for batched decoding with a
static KV cache.

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
autocast) or a plain `Qwen2ForCausalLM` (Llama plus query, key and value biases; no sliding
window in use); `lean_llama(model)` returns None for anything else and the caller uses the model
as is. The weights are read when the decoder is made, so make one per generation call (a learner
changes them every step), or call `refresh` before each (the CUDA-graph runner keeps one).

Besides `forward` (any width, the cache a growing prefix), `step` decodes one token per row with
every shape fixed by the batch and the cache's capacity and no host synchronisation: the new key
and value are written at a cursor held in a device tensor and attention runs over the whole
capacity under a mask. That is what a CUDA graph can capture (inference/cuda_graphs.py).

Learners keep the model's own forward for their log-probs: that pass is arithmetic-bound, and a
second implementation there would differ from a DDP-wrapped learner's (which must run through
its wrapper) by float rounding that Adam amplifies on near-zero gradients.
"""

from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as fn
from transformers import LlamaForCausalLM, Qwen2ForCausalLM

# Per layer: input norm, q/k/v weight (one matrix), q/k/v bias or None, output projection,
# post-attention norm, gate/up weight (one matrix), down projection.
Layer = tuple[
    torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor
]
# What a layer's attention does with its rotated queries, keys and values (batch, heads, width,
# head_dim): writes the keys and values into the layer's cache and attends.
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


FAMILIES = (LlamaForCausalLM, Qwen2ForCausalLM)


def lean_applies(model: torch.nn.Module) -> bool:
    """Whether `model` is a plain Llama or Qwen2 the lean path computes exactly."""
    if not isinstance(model, LlamaForCausalLM | Qwen2ForCausalLM) or type(model) not in FAMILIES:
        return False  # a subclass or a wrapper
    if getattr(model, "_original_forward", None) is not None:
        return False  # a forward Accelerate wrapped (mixed-precision autocast)
    if torch.is_autocast_enabled(model.device.type):
        return False
    config = model.config
    rope = getattr(config, "rope_parameters", None) or {}
    if type(model) is Qwen2ForCausalLM:
        # Qwen2 always has q/k/v biases (the lean path adds them) and an o_proj without one; a
        # sliding window, where a layer uses it, masks keys the lean path would attend to.
        family = "sliding_attention" not in (getattr(config, "layer_types", None) or ()) and not getattr(
            config, "use_sliding_window", False
        )
    else:
        family = not getattr(config, "attention_bias", False) and not getattr(config, "mlp_bias", False)
    return (
        family
        and rope.get("rope_type", "default") == "default"
        and "rope_theta" in rope
        and getattr(config, "hidden_act", "silu") == "silu"
        and getattr(config, "pretraining_tp", 1) == 1
        and (getattr(config, "attention_dropout", 0.0) == 0.0 or not model.training)
        and isinstance(model.get_output_embeddings(), torch.nn.Linear)  # not int8-quantised
        and model.get_output_embeddings().bias is None
    )


def lean_llama(model: torch.nn.Module) -> "LeanLlama | None":
    """A `LeanLlama` for `model` when it is a plain Llama or Qwen2 the lean path computes exactly,
    else None."""
    if not isinstance(model, FAMILIES) or not lean_applies(model):
        return None
    return LeanLlama(model)


@torch.no_grad()
def _joined(parts: list[torch.Tensor | None], out: torch.Tensor | None = None) -> torch.Tensor | None:
    """`parts` as one tensor (one matrix product instead of several), written into `out` when
    given so that whoever holds its address (a captured graph) sees the new values; None when a
    part is missing (a projection without a bias)."""
    if any(part is None for part in parts):
        return None
    tensors = [part for part in parts if part is not None]
    return torch.cat(tensors) if out is None else torch.cat(tensors, out=out)


def _layer_parts(layer: Any) -> tuple[list, list, list]:
    """The q/k/v weights, their biases and the gate/up weights of a decoder layer, in the order joined."""
    attention, mlp = layer.self_attn, layer.mlp
    projections = (attention.q_proj, attention.k_proj, attention.v_proj)
    return (
        [projection.weight for projection in projections],
        [projection.bias for projection in projections],
        [mlp.gate_proj.weight, mlp.up_proj.weight],
    )


def _layer(layer: Any) -> Layer:
    qkv, qkv_bias, gate_up = (_joined(parts) for parts in _layer_parts(layer))
    assert qkv is not None and gate_up is not None, "weights are never None"
    return (
        layer.input_layernorm.weight,
        qkv,
        qkv_bias,
        layer.self_attn.o_proj.weight,
        layer.post_attention_layernorm.weight,
        gate_up,
        layer.mlp.down_proj.weight,
    )


class LeanLlama:
    """Prefill and decode steps over a static cache of `capacity` positions per row.

    Rows are left-padded: every row has the same number of cached positions, the padding masked
    out by `key_mask` (True where a real token stands). The cache may hold more rows than a call
    runs (the CUDA-graph runner keeps one for its largest batch): a call of `batch` rows uses the
    cache's first `batch`."""

    def __init__(self, model: LlamaForCausalLM | Qwen2ForCausalLM) -> None:
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads or self.heads  # LlamaConfig's own default
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.hidden = config.hidden_size
        base = model.model
        self.embed = base.embed_tokens.weight
        self.layers: list[Layer] = [_layer(layer) for layer in base.layers]
        self.norm = base.norm.weight
        self.lm_head = model.get_output_embeddings().weight
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        rope = config.rope_parameters
        theta = rope.get("rope_theta") if isinstance(rope, dict) else None
        if theta is None:  # lean_applies made sure it is there
            raise ValueError("the lean path needs the model config's rope_parameters.rope_theta")
        steps = torch.arange(0, self.head_dim, 2, dtype=torch.float, device=self.device)
        self.inv_freq = 1.0 / (theta ** (steps / self.head_dim))
        kv_width = self.kv_heads * self.head_dim
        self.split = (self.heads * self.head_dim, kv_width, kv_width)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.length = 0
        self.capacity: int | None = None  # positions per row that reserve() allocated; None: not yet

    def refresh(self, model: LlamaForCausalLM | Qwen2ForCausalLM) -> None:
        """Re-read the weights this decoder holds as joined copies (q/k/v, gate/up), in place.

        The other weights it reads are the model's own tensors, so an update written into them in
        place (an optimiser step, a colocated weight sync) is already seen; the joined copies are
        rewritten into the same storage, which keeps a captured graph that reads them valid."""
        for held, layer in zip(self.layers, model.model.layers, strict=True):
            _, qkv, qkv_bias, _, _, gate_up, _ = held
            weights, biases, gate_up_parts = _layer_parts(layer)
            _joined(weights, out=qkv)
            if qkv_bias is not None:
                _joined(biases, out=qkv_bias)
            _joined(gate_up_parts, out=gate_up)

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq
        table = torch.cat((freqs, freqs), dim=-1)
        return table.cos().to(self.dtype)[:, None], table.sin().to(self.dtype)[:, None]

    def _run(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """The last position's logits (float32) after running `input_ids` (B, T) at `positions`
        through every layer, each layer's attention done by `attend`."""
        batch, width = input_ids.shape
        cos, sin = self._rotary(positions)
        x = fn.embedding(input_ids, self.embed)
        half = self.head_dim // 2
        for index, (norm_in, qkv, qkv_bias, out, norm_post, gate_up, down) in enumerate(self.layers):
            h = fn.rms_norm(x, (self.hidden,), norm_in, self.eps)
            q, k, v = fn.linear(h, qkv, qkv_bias).split(self.split, dim=-1)
            q = q.view(batch, width, self.heads, self.head_dim).transpose(1, 2)
            k = k.view(batch, width, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(batch, width, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin
            k = k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin
            attended = attend(index, q, k, v)
            x = x + fn.linear(attended.transpose(1, 2).reshape(batch, width, -1), out)
            h = fn.rms_norm(x, (self.hidden,), norm_post, self.eps)
            gate, up = fn.linear(h, gate_up).chunk(2, dim=-1)
            x = x + fn.linear(fn.silu(gate) * up, down)
        last = fn.rms_norm(x[:, -1], (self.hidden,), self.norm, self.eps)
        return fn.linear(last, self.lm_head).float()

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor
    ) -> torch.Tensor:
        """The last position's logits (float32) after running `input_ids` (B, T) at `positions`,
        the new keys and values appended to the cache; `key_mask` (B, cached + T) marks real tokens."""
        batch, width = input_ids.shape
        start, end = self.length, self.length + width
        # Causal within the new tokens, padding masked; each position always sees itself, so a
        # padding query never attends to nothing (its output is never used).
        allowed = key_mask[:, None, None, :end]
        if width > 1:
            causal = torch.ones(width, end, dtype=torch.bool, device=self.device).tril(start)
            own = torch.zeros_like(causal)
            own[:, start:] = torch.eye(width, dtype=torch.bool, device=self.device)
            allowed = (allowed & causal) | own

        def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys, values = self.keys[index][:batch], self.values[index][:batch]
            keys[:, :, start:end] = k
            values[:, :, start:end] = v
            return fn.scaled_dot_product_attention(
                q,
                keys[:, :, :end],
                values[:, :, :end],
                attn_mask=allowed,
                enable_gqa=self.kv_heads != self.heads,
            )

        logits = self._run(input_ids, positions, attend)
        self.length = end
        return logits

    def step(
        self, input_ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor, cursor: torch.Tensor
    ) -> torch.Tensor:
        """One token per row, every shape fixed and no host synchronisation: what a CUDA graph
        captures. `input_ids` and `positions` (B, 1); `key_mask` (B, C) marks real tokens over the
        C cached positions the step attends over (C at most the cache's capacity); `cursor` (a
        one-element long tensor on the device) is the column the new keys and values go to.

        The logits (float32, B × vocabulary) of the token after each row's. Columns past the
        cursor (never written, or left from an earlier batch) are masked out; each query always
        sees its own position, so a padding row (all of its mask False) attends to itself alone
        and stays finite. `self.length` is the caller's to advance: a graph replays this with
        the cursor it is given."""
        batch, capacity = key_mask.shape
        columns = torch.arange(capacity, device=key_mask.device)
        allowed = ((key_mask & (columns <= cursor)) | (columns == cursor))[:, None, None, :]

        def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys = self.keys[index][:batch, :, :capacity]
            values = self.values[index][:batch, :, :capacity]
            keys.index_copy_(2, cursor, k)
            values.index_copy_(2, cursor, v)
            return fn.scaled_dot_product_attention(
                q, keys, values, attn_mask=allowed, enable_gqa=self.kv_heads != self.heads
            )

        return self._run(input_ids, positions, attend)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, capacity: int) -> torch.Tensor:
        """Start a cache of `capacity` positions with left-padded prompts; the last position's logits."""
        self.allocate(input_ids.size(0), capacity)
        return self.restart(input_ids, attention_mask)

    def restart(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Left-padded prompts into the cache already allocated (its first rows, from position 0;
        what was there is overwritten or masked); the last position's logits."""
        self.length = 0
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        return self.forward(input_ids, positions, attention_mask.bool())

    def allocate(self, rows: int, capacity: int) -> None:
        """A fresh, empty cache of `rows` rows and `capacity` positions per row."""
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        self.length = 0
        self.capacity = capacity

    def clear(self, rows: int, capacity: int) -> None:
        """Zero the cache's first `rows` rows over its first `capacity` positions, in place."""
        for cache in self.keys + self.values:
            cache[:rows, :, :capacity].zero_()

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
        """Keep the cache rows `rows` (in that order; a row may repeat), in new tensors."""
        self.keys = [keys[rows] for keys in self.keys]
        self.values = [values[rows] for values in self.values]

    def compact(self, rows: torch.Tensor) -> None:
        """Make the cache's first `len(rows)` rows the current rows `rows` (in that order; a row
        may repeat), written in place: the storage keeps its address, which a captured graph
        holds. Only the positions written so far are copied (every row shares its length); the
        rows after them keep whatever they held, and a caller masks them out."""
        count, held = rows.numel(), self.keys[0].size(0) if self.keys else 0
        if count > held:
            raise ValueError(f"{count} rows do not fit a cache of {held}")
        for cache in self.keys + self.values:
            written = cache[:, :, : self.length]
            written[:count] = written.index_select(0, rows)  # gathered first: it may overlap its source
