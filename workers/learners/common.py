"""What the SFT, DPO and GRPO learners share: Accelerate setup, checkpoints, batches and log-probs.

Each learner is one readable loop (see sft.py, dpo.py, grpo.py) built from these pieces. Exact
resume rests on three things: everything stateful is in the Accelerate checkpoint (model,
optimiser, scheduler, RNG, and `TrainState` with the data position); every batch is a pure
function of (seed, step); and sampling uses a generator seeded from (seed, step).
"""

import contextlib
import json
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.scheduler import AcceleratedScheduler
from accelerate.utils import set_seed
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase, get_scheduler

from inference.adapters import LoraSettings, adapter_merge, adapters_disabled, lora_wrap, model_save
from inference.chat import Prompt, chat_render, turn_end_text
from inference.chat import completion_render as completion_render
from inference.generation import prompt_token_ids
from inference.policy import Policy, policy_load

CHECKPOINT_PREFIX = "checkpoint-"
COMPLETE_MARKER = "complete.json"  # written last: a checkpoint without it was interrupted mid-save
Log = Callable[[str], None]


@dataclass
class LearnerConfig:
    """Settings every learner takes; each method's config extends it."""

    model: str  # a local path or hub id of the starting policy
    output_dir: str
    seed: int = 0
    steps: int = 100  # optimiser steps
    learning_rate: float = 1e-4
    lr_scheduler: str = "constant_with_warmup"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    gradient_accumulation_steps: int = 1
    mixed_precision: str = "no"  # "auto" (bf16 on a GPU that has it), "no", "bf16" or "fp16" (GPU)
    gradient_checkpointing: bool = False  # recompute activations in the backward pass: less memory
    micro_batch_tokens: int = 0  # padded tokens (rows × longest row) per forward pass; 0: no limit
    adapter: str = "none"  # "none": train every weight; "lora": train LoRA adapters on a frozen base
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_target_modules: str = "auto"  # "auto": the family's attention and MLP projections
    checkpoint_every: int = 0  # steps between checkpoints; 0: none
    checkpoints_kept: int = 2
    log_every: int = 1
    chat: bool = True  # the tier's setting: prompts through the chat template when there is one

    def as_dict(self) -> dict:
        return asdict(self)


class TrainState:
    """The data position, saved with every checkpoint: the number of finished optimiser steps."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


@dataclass
class Learner:
    """The prepared objects a loop works with."""

    accelerator: Accelerator
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    optimizer: torch.optim.Optimizer
    scheduler: AcceleratedScheduler  # the LRScheduler as accelerator.prepare wraps it
    state: TrainState


def learner_create(config: LearnerConfig) -> tuple[Learner, Policy]:
    """Load the policy and prepare it with its optimiser and scheduler (the one `prepare` call)."""
    accelerator = Accelerator(
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        mixed_precision=mixed_precision_resolve(config.mixed_precision),
    )
    set_seed(config.seed)
    policy = policy_load(config.model, device=str(accelerator.device))
    if config.gradient_checkpointing:
        checkpointing_enable(policy.model)
    policy.model = trainable_model(policy.model, config)
    policy.model.train()
    trained = [parameter for parameter in policy.model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(
        trained,
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
        # One fused kernel for every tensor (what TRL's default `adamw_torch_fused` runs) where
        # the device has it: the same update, a third of the time on a CPU.
        fused=all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in trained) or None,
    )
    scheduler = get_scheduler(
        config.lr_scheduler, optimizer, num_warmup_steps=config.warmup_steps, num_training_steps=config.steps
    )
    model, optimizer, scheduler = accelerator.prepare(policy.model, optimizer, scheduler)
    state = TrainState()
    accelerator.register_for_checkpointing(state)
    learner = Learner(accelerator, model, policy.tokenizer, optimizer, scheduler, state)
    return learner, policy


def checkpointing_enable(model: PreTrainedModel) -> None:
    """Activation (gradient) checkpointing, non-reentrant (it works with frozen inputs and LoRA)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def checkpointing_active(model: torch.nn.Module) -> bool:
    """Whether a forward of `model` now recomputes activations (training with checkpointing on):
    such a forward keeps no KV cache, so shared prompts cannot be run once and copied."""
    return model.training and any(
        getattr(m, "gradient_checkpointing", False) is True for m in model.modules()
    )


def mixed_precision_resolve(setting: str) -> str:
    """Accelerate's mixed precision for a setting: "auto" is bf16 autocast on a GPU that supports
    it, and full precision elsewhere (on a CPU bf16 autocast is slower than fp32)."""
    if setting != "auto":
        return setting
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def budget_groups(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Consecutive groups of rows whose padded size (rows × the longest) fits `token_budget`, one
    row at least each; everything in one group when the budget is 0.

    >>> budget_groups([3, 5, 2, 8], 10), budget_groups([3, 5, 2, 8], 0)
    ([[0, 1], [2], [3]], [[0, 1, 2, 3]])
    >>> budget_groups([3, 5, 2, 8], 16)
    [[0, 1, 2], [3]]
    """
    if token_budget <= 0 or not lengths:
        return [list(range(len(lengths)))]
    groups: list[list[int]] = [[]]
    longest = 0
    for row, length in enumerate(lengths):
        if groups[-1] and (len(groups[-1]) + 1) * max(longest, length) > token_budget:
            groups.append([])
            longest = 0
        groups[-1].append(row)
        longest = max(longest, length)
    return groups


PART_OVERHEAD_TOKENS = 256  # a forward and backward pass's fixed cost, in padded tokens (tiny models, CPU)


def length_parts(lengths: list[int], overhead: int = PART_OVERHEAD_TOKENS) -> list[list[int]]:
    """Rows grouped by length so that padding each group to its longest wastes little compute:
    of the partitions of the rows sorted by length into runs, the one with the fewest padded
    tokens plus `overhead` per group. A GRPO batch where one completion ran to the token budget
    and the rest stopped early learns in two passes instead of padding every row to the longest.

    >>> length_parts([12, 12, 30, 12], overhead=8)
    [[0, 1, 3], [2]]
    >>> length_parts([12, 13, 12, 14], overhead=8)
    [[0, 2, 1, 3]]
    """
    order = sorted(range(len(lengths)), key=lambda row: (lengths[row], row))
    # The cheapest cost of the first `end` rows of `order` (infinite until one is found).
    best: list[float] = [0, *[math.inf] * len(order)]
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        longest = lengths[order[end - 1]]
        for start in range(end):
            cost = best[start] + (end - start) * longest + overhead
            if cost < best[end]:
                best[end], cut[end] = cost, start
    parts, end = [], len(order)
    while end:
        parts.append(order[cut[end] : end])
        end = cut[end]
    return parts[::-1] or [[]]


def trainable_model(model: PreTrainedModel, config: LearnerConfig) -> PreTrainedModel:
    """What the learner steps: every weight, or LoRA adapters on the frozen base. A start model that
    is itself an adapter (a LoRA run's checkpoint) keeps training that adapter in a LoRA run and is
    merged into its base for a full-weight one."""
    adapted = getattr(model, "peft_config", None) is not None
    if config.adapter != "lora":
        return adapter_merge(model) if adapted else model
    if adapted:
        for name, parameter in model.named_parameters():
            parameter.requires_grad_("lora_" in name)
        return model
    settings = LoraSettings(
        rank=config.lora_rank,
        alpha=config.lora_alpha,
        dropout=config.lora_dropout,
        target_modules=config.lora_target_modules,
    )
    return lora_wrap(model, settings)


def reference_create(config: LearnerConfig, learner: "Learner") -> torch.nn.Module:
    """The KL and DPO reference: for a LoRA learner its own model, which `reference_mode` runs with
    the adapters disabled (no second copy); otherwise a frozen copy of the starting policy, never
    prepared or stepped."""
    if config.adapter == "lora":
        return learner.accelerator.unwrap_model(learner.model)
    reference = policy_load(config.model, device=str(learner.accelerator.device)).model
    if getattr(reference, "peft_config", None) is not None:  # a LoRA checkpoint: its merged weights
        reference = adapter_merge(reference)
    reference.requires_grad_(False)
    return reference


def reference_mode(reference: torch.nn.Module) -> contextlib.AbstractContextManager:
    """What makes `reference` compute the reference policy: a LoRA learner's reference is its own
    model with the adapters disabled (no second copy of the weights); a full copy is used as is."""
    if getattr(reference, "peft_config", None) is not None and hasattr(reference, "disable_adapter"):
        return _adapters_off(reference)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _adapters_off(model: torch.nn.Module) -> Iterator[None]:
    """The base model's forward, in eval mode like a frozen reference (no dropout)."""
    training = model.training
    model.eval()
    try:
        with adapters_disabled(model):
            yield
    finally:
        model.train(training)


def optimizer_step(learner: Learner, max_grad_norm: float) -> None:
    """Clip (on the step that syncs), step the optimiser and scheduler, clear the gradients.

    Inside `accelerator.accumulate` the prepared optimiser and scheduler only act on the step that
    completes an accumulation window.
    """
    if learner.accelerator.sync_gradients and max_grad_norm > 0:
        learner.accelerator.clip_grad_norm_(learner.model.parameters(), max_grad_norm)
    learner.optimizer.step()
    learner.scheduler.step()
    learner.optimizer.zero_grad(set_to_none=True)


# -- checkpoints --------------------------------------------------------------------------------


def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(output_dir)
    found = [path for path in root.glob(f"{CHECKPOINT_PREFIX}*") if (path / COMPLETE_MARKER).exists()]
    return sorted(found, key=lambda path: int(path.name.removeprefix(CHECKPOINT_PREFIX)))


def checkpoint_save(learner: Learner, config: LearnerConfig) -> Path:
    """Save everything a resume needs, mark it complete, and prune old checkpoints."""
    path = Path(config.output_dir) / f"{CHECKPOINT_PREFIX}{learner.state.step}"
    learner.accelerator.save_state(str(path))
    if learner.accelerator.is_main_process:
        (path / COMPLETE_MARKER).write_text(json.dumps({"step": learner.state.step}) + "\n")
        for old in checkpoint_dirs(config.output_dir)[: -config.checkpoints_kept]:
            shutil.rmtree(old, ignore_errors=True)
    learner.accelerator.wait_for_everyone()
    return path


def checkpoint_resume(learner: Learner, config: LearnerConfig) -> int:
    """Load the latest complete checkpoint, if any; returns the step it resumes at."""
    found = checkpoint_dirs(config.output_dir)
    if found:
        learner.accelerator.load_state(str(found[-1]))
    return learner.state.step


def checkpoint_due(learner: Learner, config: LearnerConfig) -> bool:
    return config.checkpoint_every > 0 and learner.state.step % config.checkpoint_every == 0


def final_save(learner: Learner, config: LearnerConfig) -> Path:
    """The trained policy, saved with `save_pretrained` next to the checkpoints."""
    path = Path(config.output_dir) / "final"
    learner.accelerator.wait_for_everyone()
    if learner.accelerator.is_main_process:
        model = learner.accelerator.unwrap_model(learner.model)
        model_save(model, path)
        learner.tokenizer.save_pretrained(path)
    return path


@dataclass
class TrainResult:
    steps: int
    seconds: float
    history: list[dict] = field(default_factory=list)


def train_steps(
    learner: Learner, config: LearnerConfig, step: Callable[[int], dict[str, float]], *, log: Log
) -> TrainResult:
    """The offline loop SFT and DPO share: resume from the last checkpoint if there is one, then
    `step(n)` until `config.steps` (logging, checkpointing on schedule), then save the final policy."""
    if checkpoint_resume(learner, config):
        log(f"resumed at step {learner.state.step} from {config.output_dir}")
    result, started = TrainResult(steps=learner.state.step, seconds=0.0), time.monotonic()
    learner.model.train()
    while learner.state.step < config.steps:
        number = learner.state.step
        metrics = step(number)
        learner.state.step += 1
        result.history.append({"step": number, **metrics, "seconds": time.monotonic() - started})
        if number % config.log_every == 0:
            log(metrics_line(number, metrics))
        if checkpoint_due(learner, config):
            log(f"checkpoint {checkpoint_save(learner, config)}")
    final_save(learner, config)
    result.steps, result.seconds = learner.state.step, time.monotonic() - started
    return result


def step_rng(seed: int, step: int) -> random.Random:
    """The data order of one step: a pure function of (seed, step), so a resume replays it exactly."""
    return random.Random(seed * 1_000_003 + step)


def step_generator(seed: int, step: int) -> torch.Generator:
    """The sampling generator of one step, for the same reason."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def epoch_rows(size: int, batch_size: int, seed: int, step: int) -> list[int]:
    """The dataset rows of one step: epoch after epoch of seeded shuffles, a pure function of the step.

    Every row is seen once per epoch; a batch that crosses an epoch boundary takes the rest of one
    epoch and the start of the next.

    >>> sorted(epoch_rows(4, 2, seed=0, step=0) + epoch_rows(4, 2, seed=0, step=1))
    [0, 1, 2, 3]
    """
    if size < 1:
        raise ValueError("the dataset is empty: nothing to train on")
    rows = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(position, size)
        order = list(range(size))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        rows.append(order[offset])
    return rows


# -- batches and log-probs ----------------------------------------------------------------------


@dataclass
class SequenceBatch:
    """Prompt + completion rows, right-padded; `completion_mask` marks completion tokens."""

    input_ids: torch.Tensor  # (B, L)
    attention_mask: torch.Tensor  # (B, L)
    completion_mask: torch.Tensor  # (B, L)

    def to(self, device: torch.device) -> "SequenceBatch":
        return SequenceBatch(
            *(tensor.to(device) for tensor in (self.input_ids, self.attention_mask, self.completion_mask))
        )

    def rows(self, index: torch.Tensor | slice | list[int]) -> "SequenceBatch":
        """Those rows, their padding trimmed to the longest of them."""
        mask = self.attention_mask[index]
        width = max(1, int(mask.sum(-1).max())) if mask.numel() else mask.size(-1)
        return SequenceBatch(
            self.input_ids[index][:, :width], mask[:, :width], self.completion_mask[index][:, :width]
        )

    def micro_batches(self, token_budget: int) -> list[list[int]]:
        """Row groups for forward passes within `token_budget` padded tokens (see budget_groups)."""
        return budget_groups(self.attention_mask.sum(-1).tolist(), token_budget)


def sequence_batch(
    prompts: list[list[int]], completions: list[list[int]], pad_token_id: int
) -> SequenceBatch:
    """Rows of prompt then completion tokens, right-padded: positions match unpadded generation."""
    length = max(
        len(prompt) + len(completion) for prompt, completion in zip(prompts, completions, strict=True)
    )
    size = len(prompts)
    input_ids = torch.full((size, length), pad_token_id, dtype=torch.long)
    attention = torch.zeros((size, length), dtype=torch.long)
    completion_mask = torch.zeros((size, length), dtype=torch.long)
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        end = len(prompt) + len(completion)
        input_ids[row, :end] = torch.tensor(prompt + completion, dtype=torch.long)
        attention[row, :end] = 1
        completion_mask[row, len(prompt) : end] = 1
    return SequenceBatch(input_ids, attention, completion_mask)


def spans_batch(
    sequences: list[list[int]], spans: list[list[tuple[int, int]]], pad_token_id: int
) -> SequenceBatch:
    """Rows of whole token sequences, right-padded; `completion_mask` marks each row's spans
    ([start, end) token positions): an agent episode is one row, its turns' tokens the spans."""
    length = max(len(sequence) for sequence in sequences)
    size = len(sequences)
    input_ids = torch.full((size, length), pad_token_id, dtype=torch.long)
    attention = torch.zeros((size, length), dtype=torch.long)
    completion_mask = torch.zeros((size, length), dtype=torch.long)
    for row, (sequence, row_spans) in enumerate(zip(sequences, spans, strict=True)):
        input_ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
        attention[row, : len(sequence)] = 1
        for start, end in row_spans:
            completion_mask[row, start:end] = 1
    return SequenceBatch(input_ids, attention, completion_mask)


def text_batch(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str], completions: list[str], *, chat: bool = True
) -> SequenceBatch:
    """A batch from text: the prompt as the policy sees it (rendered), the completion closed by the
    end of an assistant turn (`turn_end_text`: the template's end-of-turn token, else EOS). Only
    the completion and its closing tokens are targets."""
    end = tokenizer(turn_end_text(tokenizer, chat=chat), add_special_tokens=False)["input_ids"]
    end = end or [tokenizer.eos_token_id]
    prompt_ids = [prompt_token_ids(tokenizer, prompt) for prompt in prompts]
    completion_ids = [
        tokenizer(completion, add_special_tokens=False)["input_ids"] + end for completion in completions
    ]
    return sequence_batch(prompt_ids, completion_ids, tokenizer.pad_token_id)


def token_logprobs(model: torch.nn.Module, batch: SequenceBatch, temperature: float = 1.0) -> torch.Tensor:
    """log p(token t | tokens < t) for t = 1..L-1, shape (B, L-1); align masks with `[:, 1:]`."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    logits = logits[:, :-1].float() / temperature
    targets = batch.input_ids[:, 1:]
    return logits.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)


def prompt_render(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, *, chat: bool = True) -> str:
    """A prompt as the policy sees it (`inference.chat.chat_render`): a user message or a
    conversation (TRL's conversational format) through the chat template, rollouts and evaluation
    rendering it the same way."""
    return chat_render(tokenizer, prompt, chat=chat)


def completion_logprobs(
    model: torch.nn.Module, batch: SequenceBatch, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and the mask of completion tokens, both (B, L-1); log-probs outside
    the mask are not meaningful. Rows that share a prompt (a GRPO group, a DPO pair) have it run
    once, its keys and values copied to each row: the same values and gradients, less compute."""
    mask = batch.completion_mask[:, 1:].float()
    prompt_lengths = (batch.completion_mask.cumsum(-1) == 0).sum(-1)
    prompts = [
        tuple(row[:length].tolist()) for row, length in zip(batch.input_ids, prompt_lengths, strict=True)
    ]
    if (
        len(set(prompts)) == len(prompts)
        or not bool(batch.completion_mask.any(-1).all())
        or checkpointing_active(model)
    ):
        return token_logprobs(model, batch, temperature), mask
    return _shared_prompt_logprobs(model, batch, prompts, prompt_lengths, temperature), mask


def _shared_prompt_logprobs(
    model: torch.nn.Module,
    batch: SequenceBatch,
    prompts: list[tuple[int, ...]],
    prompt_lengths: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    device, (size, length) = batch.input_ids.device, batch.input_ids.shape
    unique = list(dict.fromkeys(prompts))
    index = {prompt: row for row, prompt in enumerate(unique)}
    rows = torch.tensor([index[prompt] for prompt in prompts], device=device)
    # The distinct prompts, left-padded, once: their cache is then copied to every row.
    width = max(len(prompt) for prompt in unique)
    prompt_ids = torch.zeros((len(unique), width), dtype=torch.long, device=device)
    prompt_mask = torch.zeros((len(unique), width), dtype=torch.long, device=device)
    for row, prompt in enumerate(unique):
        prompt_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        prompt_mask[row, width - len(prompt) :] = 1
    cache = DynamicCache()
    first = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0),
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    cache.batch_select_indices(rows)
    # Each row's rest (its completion; for an agent episode every turn after the first prompt,
    # the mask then picks the turns' tokens), right-padded, continuing its prompt's positions.
    completion_lengths = batch.attention_mask.sum(-1) - prompt_lengths
    steps = torch.arange(int(completion_lengths.max()), device=device)
    valid = steps[None, :] < completion_lengths[:, None]
    source = (prompt_lengths[:, None] + steps[None, :]).clamp(max=length - 1)
    completion_ids = batch.input_ids.gather(1, source) * valid
    rest = model(
        input_ids=completion_ids,
        attention_mask=torch.cat([prompt_mask[rows], valid.long()], dim=1),
        position_ids=prompt_lengths[:, None] + steps[None, :],
        cache=cache,
        use_cache=True,
    ).logits
    logits = torch.cat([first[rows][:, None], rest[:, :-1]], dim=1).float() / temperature
    logprobs = logits.log_softmax(-1).gather(-1, completion_ids[..., None]).squeeze(-1) * valid
    # Back to the (B, L-1) layout: completion token j of a row stands at its prompt length + j.
    target = (prompt_lengths[:, None] - 1 + steps[None, :]).clamp(max=length - 2)
    return torch.zeros((size, length - 1), dtype=logprobs.dtype, device=device).scatter_add(
        1, target, logprobs
    )


def sequence_logprob_sums(model: torch.nn.Module, batch: SequenceBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's summed completion log-prob and its completion token count, both (B,)."""
    logprobs, mask = completion_logprobs(model, batch)
    return (logprobs * mask).sum(-1), mask.sum(-1)


def metrics_line(step: int, metrics: dict[str, float]) -> str:
    return f"step {step:4d}  " + "  ".join(f"{name} {value:.4f}" for name, value in metrics.items())
