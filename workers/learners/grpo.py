"""GRPO-family RL with verifiable rewards: sample groups, score them in the sandbox, learn.

The loop, per step: pick the step's task items (a pure function of seed and step), sample a group
of completions per item with the current policy (behaviour log-probs recorded), score them with
the sandboxed unit tests, turn rewards into group-normalised advantages, drop what must not be
learned from (errored trajectories, groups whose rewards do not vary, trajectories older than the
staleness bound), then take `num_iterations` clipped policy-gradient steps on the batch.

The step after sampling is one function, `grpo_step`, fed two ways: `train_grpo` samples each
step's groups in this process (`manage.py train_learner grpo`, `train_demo`, the benchmarks), and a
run's learner (workers/run_learner.py) takes them from the rollout workers.

The loss is TRL's for the same settings (tests/test_workers_parity.py): "sequence_mean" is TRL's
`grpo`, "token_mean" its `bnpo`, "dr_grpo" its `dr_grpo`.
"""

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from inference.generation import Completion
from inference.policy import Policy
from inference.settings import SamplingParams
from workers.learners.common import (
    Learner,
    LearnerConfig,
    Log,
    SequenceBatch,
    TrainResult,
    checkpoint_due,
    checkpoint_resume,
    checkpoint_save,
    completion_logprobs,
    final_save,
    learner_create,
    length_parts,
    metrics_line,
    optimizer_step,
    reference_create,
    reference_mode,
    spans_batch,
    step_generator,
    step_rng,
)
from workers.rollout import Trajectory, rollout_groups

AGGREGATIONS = ("token_mean", "sequence_mean", "dr_grpo")


@dataclass
class GRPOConfig(LearnerConfig):
    learning_rate: float = 1e-3
    group_size: int = 8
    prompts_per_step: int = 16
    num_iterations: int = 1  # optimisation passes over each generation batch (>1: the ratio is clipped)
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    beta: float = 0.0  # KL coefficient to the reference (the starting policy); 0: no reference is loaded
    kl_importance_correction: bool = (
        True  # weigh the KL by the importance ratio (unbiased off-policy; TRL's default)
    )
    loss_aggregation: str = "token_mean"
    scale_rewards: bool = True  # divide advantages by the group's reward std
    skip_zero_variance_groups: bool = True
    max_staleness: int = 0  # learn only from trajectories sampled by policy versions >= current - this
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    time_budget_s: float = 0.0  # stop after this many seconds of training (demos); 0: run all steps
    # Truncated importance sampling (verl's TIS): the decoder that sampled (bf16, another engine)
    # and the learner disagree on log-probs; > 0 takes the PPO ratio against the learner's own
    # log-probs and weighs each token by min(learner p / decoder p, tis_cap). 0: off.
    tis_cap: float = 0.0

    def __post_init__(self) -> None:
        if self.loss_aggregation not in AGGREGATIONS:
            raise ValueError(
                f"loss_aggregation must be one of {', '.join(AGGREGATIONS)}; got {self.loss_aggregation!r}"
            )
        if self.tis_cap < 0:
            raise ValueError(f"tis_cap must be 0 (off) or positive; got {self.tis_cap}")
        if self.group_size < 2:
            raise ValueError(
                f"group_size must be at least 2 (advantages compare a group); got {self.group_size}"
            )

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
        )


@dataclass
class GRPOBatch:
    sequences: SequenceBatch
    old_logprobs: torch.Tensor  # (B, L-1) behaviour log-probs at completion positions
    advantages: torch.Tensor  # (B,)
    # (B, L-1) the learner's own log-probs before this batch's first update, filled by the first
    # pass over each row (truncated importance sampling reads them on every later pass)
    proximal_logprobs: torch.Tensor | None = None


# -- advantages and the loss (pure functions, compared with TRL's in the tests) -----------------

# A token whose learner and decoder log-probs differ by more than this (a probability ratio beyond
# e^0.5 ≈ 1.65 either way) counts as mismatched.
MISMATCH_TOKEN_GAP = 0.5


def logprob_mismatch(
    learner_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """How far the decoder that sampled the tokens and the learner disagree on them, over the
    masked tokens: the mean |Δ log p|, the k3 estimate of KL(decoder ‖ learner) (unbiased on the
    decoder's own samples, never negative) and the share of tokens beyond MISMATCH_TOKEN_GAP.

    >>> same = torch.tensor([[-1.0, -2.0]])
    >>> logprob_mismatch(same, same, torch.ones(1, 2))
    {'logprob_gap': 0.0, 'mismatch_kl': 0.0, 'mismatch_tokens': 0.0}
    """
    gap = (learner_logprobs.detach() - behaviour_logprobs) * mask
    tokens = mask.sum().clamp(min=1.0)
    k3 = (torch.exp(gap) - gap - 1) * mask
    return {
        "logprob_gap": float(gap.abs().sum() / tokens),
        "mismatch_kl": float(k3.sum() / tokens),
        "mismatch_tokens": float(((gap.abs() > MISMATCH_TOKEN_GAP).float() * mask).sum() / tokens),
    }


def group_advantages(
    rewards: torch.Tensor, group_size: int, *, scale: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, per-row group std): reward minus its group's mean, over the std when `scale`.

    Errored trajectories carry a NaN reward: they are left out of their group's statistics (TRL
    does the same) and their advantage is NaN, for the caller to mask.

    >>> advantages, std = group_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2)
    >>> [round(value, 3) for value in advantages.tolist()], std.tolist()
    ([0.707, -0.707, 0.0, 0.0], [0.7071067690849304, 0.7071067690849304, 0.0, 0.0])
    """
    grouped = rewards.view(-1, group_size)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    count = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    variance = torch.nanmean((grouped - mean) ** 2, dim=1, keepdim=True) * count / (count - 1).clamp(min=1)
    std = variance.sqrt().expand_as(grouped).reshape(-1)
    advantages = rewards - mean.expand_as(grouped).reshape(-1)
    if scale:
        advantages = advantages / (std + 1e-4)
    return advantages, std


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    beta: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    aggregation: str = "token_mean",
    max_completion_length: int = 0,
    kl_importance_correction: bool = True,
    proximal_logprobs: torch.Tensor | None = None,
    tis_cap: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate with an optional k3 KL penalty, aggregated over tokens as configured.

    All tensors are per token, (B, T), except `advantages` (B,). `max_completion_length` is Dr.
    GRPO's constant normaliser (the token budget), which removes the length bias of a per-sequence mean.
    The tokens were sampled by the behaviour policy, so with `kl_importance_correction` the KL
    estimate is weighted by the importance ratio, which makes its gradient unbiased (TRL's
    `use_bias_correction_kl`).

    With `tis_cap` > 0 (truncated importance sampling) `old_logprobs` are the decoder's and
    `proximal_logprobs` the learner's own before the update: the ratio is taken against the
    learner's, and each token's loss is weighed by min(exp(proximal - old), tis_cap), which corrects
    for the decoder sampling from a slightly different distribution without letting one token's
    weight explode.
    """
    weight: torch.Tensor | float = 1.0
    if tis_cap > 0:
        if proximal_logprobs is None:
            raise ValueError("truncated importance sampling needs the learner's proximal log-probs")
        weight = torch.exp(proximal_logprobs - old_logprobs).clamp(max=tis_cap).detach()
        old_logprobs = proximal_logprobs
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token = -torch.min(ratio * advantages[:, None], clipped * advantages[:, None]) * weight
    kl = torch.zeros_like(per_token)
    if beta != 0.0:
        if ref_logprobs is None:
            raise ValueError("a KL penalty (beta != 0) needs the reference's log-probs")
        delta = ref_logprobs - logprobs
        kl = torch.exp(delta) - delta - 1
        if kl_importance_correction:
            kl = kl * ratio
        per_token = per_token + beta * kl
    if aggregation == "sequence_mean":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif aggregation == "token_mean":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    elif aggregation == "dr_grpo":
        loss = (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    else:
        raise ValueError(f"unknown loss aggregation {aggregation!r}: one of {', '.join(AGGREGATIONS)}")
    tokens = mask.sum().clamp(min=1.0)
    is_clipped = ((ratio < 1 - epsilon_low) & (advantages[:, None] < 0)) | (
        (ratio > 1 + epsilon_high) & (advantages[:, None] > 0)
    )
    metrics = {
        "clip_fraction": float((is_clipped.float() * mask).sum() / tokens),
        "kl": float((kl.detach() * mask).sum() / tokens),
    }
    return loss, metrics


# -- from trajectories to a batch ----------------------------------------------------------------


def learnable(
    trajectories: list[Trajectory], group_size: int, config: GRPOConfig, version: int
) -> tuple[list[int], torch.Tensor, dict]:
    """Indices of the trajectories to learn from, every trajectory's advantage, and what was dropped."""
    rewards = torch.tensor([float("nan") if t.reward is None else t.reward for t in trajectories])
    advantages, std = group_advantages(rewards, group_size, scale=config.scale_rewards)
    keep = []
    dropped = {"errored": 0, "zero_variance": 0, "stale": 0}
    for index, trajectory in enumerate(trajectories):
        if trajectory.outcome == "errored":
            dropped["errored"] += 1
        elif trajectory.policy_version < version - config.max_staleness:
            dropped["stale"] += 1
        elif config.skip_zero_variance_groups and (torch.isnan(std[index]) or std[index] == 0):
            dropped["zero_variance"] += 1
        else:
            keep.append(index)
    return keep, advantages, dropped


def episode_sequence(completions: list[Completion]) -> tuple[list[int], list[tuple[int, int]]] | None:
    """A multi-turn episode as ONE token sequence, when each turn's prompt extends the previous
    turn's prompt and completion (the transcript generation with cache reuse keeps): the last
    turn's prompt and completion, and each turn's completion span in it. None otherwise.

    >>> turn = lambda prompt, tokens: Completion("", tokens, [0.0] * len(tokens), "stop", prompt)
    >>> episode_sequence([turn([1, 2], [3]), turn([1, 2, 3, 4], [5, 6])])
    ([1, 2, 3, 4, 5, 6], [(2, 3), (4, 6)])
    >>> episode_sequence([turn([1, 2], [3]), turn([1, 9, 3, 4], [5])]) is None
    True
    """
    spans: list[tuple[int, int]] = []
    previous: list[int] = []
    for completion in completions:
        prompt = completion.prompt_token_ids
        if prompt[: len(previous)] != previous or not prompt:
            return None
        spans.append((len(prompt), len(prompt) + len(completion.token_ids)))
        previous = prompt + completion.token_ids
    return previous, spans


def grpo_batch(
    trajectories: list[Trajectory],
    keep: list[int],
    advantages: torch.Tensor,
    pad_token_id: int,
    *,
    episodes_as_sequences: bool = True,
) -> GRPOBatch:
    """One row per episode: a one-completion episode is its prompt and completion; a multi-turn
    episode is its whole transcript as one sequence, the turns' tokens masked in (one forward
    pass, the same log-probs and, under token_mean, gradients as a row per turn: tested). An
    episode whose turns do not form one transcript (or with `episodes_as_sequences` off) gives a
    row per turn. Every row carries its episode's advantage (the reward comes at the end and
    credits every action that led to it)."""
    sequences, spans, olds, owners = [], [], [], []
    for index in keep:
        turns = [c for c in trajectories[index].completions if c.token_ids]
        whole = episode_sequence(turns) if episodes_as_sequences and len(turns) > 1 else None
        if whole is not None:
            sequences.append(whole[0])
            spans.append(whole[1])
            olds.append([(start, c.logprobs) for (start, _), c in zip(whole[1], turns, strict=True)])
            owners.append(index)
            continue
        for completion in turns:
            prompt = completion.prompt_token_ids
            sequences.append(prompt + completion.token_ids)
            spans.append([(len(prompt), len(prompt) + len(completion.token_ids))])
            olds.append([(len(prompt), completion.logprobs)])
            owners.append(index)
    batch = spans_batch(sequences, spans, pad_token_id)
    old = torch.zeros(batch.input_ids.shape[0], batch.input_ids.shape[1] - 1)
    for row, parts in enumerate(olds):
        for start, logprobs in parts:
            old[row, start - 1 : start - 1 + len(logprobs)] = torch.tensor(logprobs)
    return GRPOBatch(batch, old, advantages[owners].nan_to_num(0.0))


def step_items(items: list[dict], config: GRPOConfig, step: int) -> list[dict]:
    """The task items of one step: a pure function of (seed, step)."""
    return step_rng(config.seed, step).sample(items, min(config.prompts_per_step, len(items)))


# -- the loop -----------------------------------------------------------------------------------


def learn_on_batch(
    learner: Learner, batch: GRPOBatch, config: GRPOConfig, reference: torch.nn.Module | None
) -> dict[str, float]:
    """`num_iterations` optimiser steps on one generation batch, each accumulated over micro-batches
    (`gradient_accumulation_steps` of them, each split again to fit `micro_batch_tokens`)."""
    accelerator = learner.accelerator
    metrics: dict[str, float] = {}
    first: dict[str, float] = {}
    for iteration in range(config.num_iterations):
        for rows in torch.arange(len(batch.advantages)).tensor_split(config.gradient_accumulation_steps):
            with accelerator.accumulate(learner.model):
                if len(rows):
                    metrics = _learn_rows(learner, batch, rows, config, reference, first_pass=iteration == 0)
                    if iteration == 0:
                        first = _rows_mismatch_add(first, metrics, len(rows))
                optimizer_step(learner, config.max_grad_norm)
    # The mismatch is the decoder's against the learner before this batch changed it: the first pass.
    mismatch = {name: first[name] / max(1, first["rows"]) for name in MISMATCH_METRICS}
    # `tokens`: what the step trained on (prompts and completions, padding not counted), every pass
    # over the batch counted, as the step's MFU wants (workers/learners/device_figures.py).
    tokens = float(batch.sequences.attention_mask.sum()) * config.num_iterations
    return metrics | mismatch | {"tokens": tokens}


MISMATCH_METRICS = ("logprob_gap", "mismatch_kl", "mismatch_tokens")


def _rows_mismatch_add(total: dict[str, float], metrics: dict[str, float], rows: int) -> dict[str, float]:
    """Sums of the first pass's mismatch figures, weighted by rows (the micro-batches differ in size)."""
    out = dict(total) or {name: 0.0 for name in (*MISMATCH_METRICS, "rows")}
    for name in MISMATCH_METRICS:
        out[name] += metrics[name] * rows
    out["rows"] += rows
    return out


def _learn_rows(
    learner: Learner,
    batch: GRPOBatch,
    rows: torch.Tensor,
    config: GRPOConfig,
    reference: torch.nn.Module | None,
    *,
    first_pass: bool = True,
) -> dict[str, float]:
    """Backward the loss of `rows` in forward passes that fit the token budget (without one, in
    passes of rows of like lengths: `length_parts`). Each part's loss
    is weighted by its share of the rows' completion tokens (token mean) or rows (sequence mean,
    Dr. GRPO), so the gradient is the one a single pass over all the rows would give."""
    device = learner.accelerator.device
    metrics = {"loss": 0.0, "clip_fraction": 0.0, "kl": 0.0} | {name: 0.0 for name in MISMATCH_METRICS}
    sequences = batch.sequences.rows(rows)
    tokens = sequences.completion_mask.sum().clamp(min=1)
    if config.micro_batch_tokens:
        parts = sequences.micro_batches(config.micro_batch_tokens)
    else:  # no budget: rows of like lengths together, so little compute goes to padding
        parts = length_parts(sequences.attention_mask.sum(-1).tolist())
    for number, part in enumerate(parts):
        part_rows = rows[part]
        micro = batch.sequences.rows(part_rows).to(device)
        width = micro.input_ids.size(1) - 1
        logprobs, mask = completion_logprobs(learner.model, micro, config.temperature)
        behaviour = batch.old_logprobs[part_rows][:, :width].to(device)
        proximal = _proximal(batch, part_rows, width, logprobs, first_pass).to(device)
        ref_logprobs = None
        if reference is not None:
            with torch.no_grad(), reference_mode(reference):
                ref_logprobs, _ = completion_logprobs(reference, micro, config.temperature)
        loss, part_metrics = grpo_loss(
            logprobs,
            behaviour,
            batch.advantages[part_rows].to(device),
            mask,
            epsilon_low=config.epsilon_low,
            epsilon_high=config.epsilon_high,
            beta=config.beta,
            ref_logprobs=ref_logprobs,
            aggregation=config.loss_aggregation,
            max_completion_length=config.max_new_tokens,
            kl_importance_correction=config.kl_importance_correction,
            proximal_logprobs=proximal,
            tis_cap=config.tis_cap,
        )
        token_share = float(micro.completion_mask.sum() / tokens)
        share = token_share if config.loss_aggregation == "token_mean" else len(part) / len(rows)
        # Several processes (DDP) all-reduce once per micro-batch, on its last part, whatever
        # number of parts each process's rows need.
        last = number == len(parts) - 1
        with contextlib.nullcontext() if last else learner.accelerator.no_sync(learner.model):
            learner.accelerator.backward(loss * share if share != 1 else loss)
        # The rows' figures, whatever the split: the loss as the gradient weighs it, the
        # per-token figures over all the rows' tokens.
        metrics["loss"] += loss.item() * share
        metrics["clip_fraction"] += part_metrics["clip_fraction"] * token_share
        metrics["kl"] += part_metrics["kl"] * token_share
        for name, value in logprob_mismatch(proximal, behaviour, mask).items():
            metrics[name] += value * token_share
    return metrics


def _proximal(
    batch: GRPOBatch, rows: torch.Tensor, width: int, logprobs: torch.Tensor, first_pass: bool
) -> torch.Tensor:
    """The learner's log-probs of these rows before the batch's first update: this pass's own on
    the first pass (kept in the batch), those kept on later passes (`num_iterations` > 1)."""
    if batch.proximal_logprobs is None:
        batch.proximal_logprobs = torch.zeros_like(batch.old_logprobs)
    if first_pass:
        batch.proximal_logprobs[rows, :width] = logprobs.detach().float().cpu()
        return logprobs.detach()
    return batch.proximal_logprobs[rows][:, :width]


# -- one step, whoever sampled its rollouts ------------------------------------------------------


@dataclass
class StepChoice:
    """What a step chose: the trajectories it learns from (indices), every trajectory's advantage,
    and how many it dropped, by why (errored, zero_variance, stale)."""

    keep: list[int]
    advantages: torch.Tensor
    dropped: dict[str, int]


# learnable's shape: (trajectories, group_size, config, version=) -> (keep, advantages, dropped)
Choose = Callable[..., tuple[list[int], torch.Tensor, dict[str, int]]]
# grpo_batch's shape: (trajectories, keep, advantages, pad_token_id) -> this process's batch
BatchOf = Callable[[list[Trajectory], list[int], torch.Tensor, int], GRPOBatch]
Learn = Callable[[Learner, GRPOBatch, GRPOConfig, torch.nn.Module | None], dict[str, float]]


def grpo_step(
    learner: Learner,
    trajectories: list[Trajectory],
    config: GRPOConfig,
    reference: torch.nn.Module | None,
    version: int,
    *,
    choose: Choose = learnable,
    batch_of: BatchOf = grpo_batch,
    learn: Learn = learn_on_batch,
) -> tuple[StepChoice, dict[str, float]]:
    """One step of the loop on trajectories sampled by policy `version`, whoever sampled them (this
    process, in `train_grpo`; the rollout workers, for a run): choose what to learn from, batch
    it, learn on it, count the step. A run's algorithm may choose and learn its own way
    (tests/toy_reinforce.py); a run on several processes batches through its group, which hands
    each process its share (workers/learner_group.py)."""
    keep, advantages, dropped = choose(trajectories, config.group_size, config, version=version)
    metrics: dict[str, float] = {}
    if keep:
        batch = batch_of(trajectories, keep, advantages, learner.tokenizer.pad_token_id)
        learner.model.train()
        metrics = learn(learner, batch, config, reference)
    learner.state.step += 1
    return StepChoice(keep, advantages, dropped), metrics


# -- as a run's learner (workers/run_learner.py reads these for every online algorithm) ---------


def run_config(run: Any, common: dict[str, Any]) -> GRPOConfig:
    """The run's GRPO settings: the common ones, its hyperparameters, its tier's sampling."""
    hyper, tier = run.resolved, run.tier_config
    return GRPOConfig(
        **common,
        group_size=hyper["group_size"],
        prompts_per_step=hyper["batch_size"],
        epsilon_low=hyper["clip_epsilon"],
        epsilon_high=hyper["clip_epsilon"],
        beta=hyper["kl_coef"],
        loss_aggregation=hyper["loss_aggregation"],
        scale_rewards=hyper["scale_rewards"] == "group",
        tis_cap=hyper.get("tis_cap", 0.0),
        max_staleness=hyper["staleness"],
        max_new_tokens=tier["max_new_tokens"],
        temperature=tier["temperature"],
        top_p=tier["top_p"],
        top_k=tier["top_k"],
    )


def reference_for(config: GRPOConfig, learner: Learner) -> torch.nn.Module | None:
    """The frozen starting policy the KL penalty needs; none without one."""
    return reference_create(config, learner) if config.beta else None


learn_batch = learn_on_batch  # what the run learner calls on each step's batch


# -- trained outside a run: the rollouts sampled in this process ---------------------------------


def train_grpo(config: GRPOConfig, items: list[dict], *, pool=None, log: Log = print) -> TrainResult:
    """Train with GRPO on `items` (code task items graded by their unit tests); resumes if it can."""
    learner, _ = learner_create(config)
    reference = reference_for(config, learner)
    if checkpoint_resume(learner, config):
        log(f"resumed at step {learner.state.step} from {config.output_dir}")
    result, started = TrainResult(steps=learner.state.step, seconds=0.0), time.monotonic()
    while learner.state.step < config.steps:
        step, rollout_started = learner.state.step, time.monotonic()
        trajectories = own_rollouts(learner, items, config, pool)
        rollout_seconds = time.monotonic() - rollout_started
        chosen, metrics = grpo_step(learner, trajectories, config, reference, version=step)
        record = step_record(step, trajectories, chosen, metrics) | {
            "rollout_seconds": rollout_seconds,
            "seconds": time.monotonic() - started,
        }
        result.history.append(record)
        if step % config.log_every == 0:
            log(metrics_line(step, {k: v for k, v in record.items() if k != "step"}))
        if checkpoint_due(learner, config):
            path = checkpoint_save(learner, config)
            log(f"checkpoint {path}")
        if config.time_budget_s and time.monotonic() - started > config.time_budget_s:
            log(f"time budget of {config.time_budget_s:g} s reached after {learner.state.step} steps")
            break
    final_save(learner, config)
    result.steps, result.seconds = learner.state.step, time.monotonic() - started
    return result


def own_rollouts(learner: Learner, items: list[dict], config: GRPOConfig, pool=None) -> list[Trajectory]:
    """The step's groups, sampled here by the learner's current weights (policy version = step)."""
    step = learner.state.step
    learner.model.eval()
    behaviour = Policy(
        learner.accelerator.unwrap_model(learner.model), learner.tokenizer, version=step, chat=config.chat
    )
    return rollout_groups(
        behaviour,
        step_items(items, config, step),
        config.sampling,
        group_size=config.group_size,
        generator=step_generator(config.seed, step),
        pool=pool,
    )


def step_record(
    step: int, trajectories: list[Trajectory], chosen: StepChoice, metrics: dict[str, float]
) -> dict[str, float]:
    """A step's line of `TrainResult.history`: its rewards, what it learned from, its metrics."""
    scored = [t for t in trajectories if t.outcome == "scored"]
    return {
        "step": step,
        "reward": sum(t.reward or 0.0 for t in scored) / max(1, len(scored)),
        "pass_rate": sum(t.passed for t in scored) / max(1, len(scored)),
        "learned": len(chosen.keep),
        **{f"dropped_{name}": count for name, count in chosen.dropped.items()},
        **metrics,
    }


# `manage.py train_learner grpo`: trained outside a run, from a JSONL file.
CONFIG = GRPOConfig
train_standalone = train_grpo
