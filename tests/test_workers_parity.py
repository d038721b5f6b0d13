"""Flywheel's GRPO and DPO losses equal TRL's for identical inputs (TRL is a test dependency only).

Both sides run the same tiny model on the same token ids: TRL through its trainers' own loss code
(`GRPOTrainer._compute_loss`, `DPOTrainer._compute_loss` on a batch from its own collator),
Flywheel through `completion_logprobs` / `grpo_loss` and `pair_batch` / `dpo_loss`. TRL puts
the prompt left-padded before the completion, so the prompts here have equal lengths, which makes
its rows and Flywheel's right-padded rows the same tokens at the same positions.
"""

from pathlib import Path

import pytest
import torch
from datasets import Dataset
from trl import DPOConfig as TRLDPOConfig
from trl import DPOTrainer, GRPOTrainer
from trl import GRPOConfig as TRLGRPOConfig

from inference.policy import policy_load
from tests.tiny_base import TINY
from workers.base_model import base_model_build
from workers.learners.common import completion_logprobs, sequence_batch
from workers.learners.dpo import dpo_loss, pair_batch, pair_logps
from workers.learners.grpo import grpo_loss

PROMPT_LENGTH, COMPLETION_LENGTH, ROWS = 6, 5, 4
# Flywheel's aggregation name -> TRL's loss_type
AGGREGATIONS = {"token_mean": "bnpo", "sequence_mean": "grpo", "dr_grpo": "dr_grpo"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-base")
    base_model_build(path, TINY, log=lambda line: None)
    return path


def trl_common() -> dict:
    return {"use_cpu": True, "report_to": [], "bf16": False, "fp16": False, "save_strategy": "no"}


@pytest.fixture(scope="module")
def grpo_trainer(tiny_model: Path, tmp_path_factory) -> GRPOTrainer:
    policy = policy_load(tiny_model)
    args = TRLGRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl-grpo")),
        per_device_train_batch_size=ROWS,
        num_generations=ROWS,
        max_completion_length=COMPLETION_LENGTH,
        temperature=1.0,
        **trl_common(),
    )
    trainer = GRPOTrainer(
        model=policy.model,
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["x"] * ROWS}),
        processing_class=policy.tokenizer,
    )
    trainer.model.eval()  # eval mode: TRL does not divide the loss by its accumulation steps
    return trainer


def grpo_inputs(seed: int) -> dict[str, torch.Tensor]:
    """Random prompt and completion ids, ragged completions, off-policy old and reference log-probs."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 3, 1, 4])
    completion_mask = (torch.arange(COMPLETION_LENGTH)[None, :] < lengths[:, None]).long()
    shape = (ROWS, COMPLETION_LENGTH)
    return {
        "prompt_ids": torch.randint(3, 250, (ROWS, PROMPT_LENGTH), generator=generator),
        "prompt_mask": torch.ones(ROWS, PROMPT_LENGTH, dtype=torch.long),
        "completion_ids": torch.randint(3, 250, shape, generator=generator) * completion_mask,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.2, -0.4, 0.7, -1.5]),
        "old_per_token_logps": -torch.rand(shape, generator=generator) * 6 - 2,
        "ref_per_token_logps": -torch.rand(shape, generator=generator) * 6 - 2,
    }


def flywheel_grpo_loss(
    model, inputs: dict, *, aggregation: str, beta: float, correction: bool = True
) -> torch.Tensor:
    """Flywheel's loss on the same rows: its own batch, log-probs and aggregation."""
    masks = inputs["completion_mask"].bool()
    prompts = inputs["prompt_ids"].tolist()
    completions = [row[mask].tolist() for row, mask in zip(inputs["completion_ids"], masks, strict=True)]
    batch = sequence_batch(prompts, completions, pad_token_id=0)
    logprobs, mask = completion_logprobs(model, batch)
    window = slice(PROMPT_LENGTH - 1, PROMPT_LENGTH - 1 + COMPLETION_LENGTH)  # completion positions
    loss, _ = grpo_loss(
        logprobs[:, window],
        inputs["old_per_token_logps"],
        inputs["advantages"],
        mask[:, window],
        beta=beta,
        ref_logprobs=inputs["ref_per_token_logps"],
        aggregation=aggregation,
        max_completion_length=COMPLETION_LENGTH,
        kl_importance_correction=correction,
    )
    return loss


@pytest.mark.parametrize(("beta", "correction"), [(0.0, True), (0.04, True), (0.04, False)])
@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_grpo_loss_equals_trls_for_each_aggregation(
    grpo_trainer: GRPOTrainer, aggregation: str, beta: float, correction: bool
):
    grpo_trainer.loss_type, grpo_trainer.beta = AGGREGATIONS[aggregation], beta
    grpo_trainer.args.use_bias_correction_kl = correction
    inputs = grpo_inputs(seed=len(aggregation))
    theirs = grpo_trainer._compute_loss(grpo_trainer.model, inputs)
    ours = flywheel_grpo_loss(
        grpo_trainer.model, inputs, aggregation=aggregation, beta=beta, correction=correction
    )
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-6)
    assert abs(ours.item()) > 1e-3  # a real, non-trivial loss was compared


def test_grpo_loss_gradients_equal_trls(grpo_trainer: GRPOTrainer):
    grpo_trainer.loss_type, grpo_trainer.beta = "bnpo", 0.04
    grpo_trainer.args.use_bias_correction_kl = True
    inputs = grpo_inputs(seed=11)
    model = grpo_trainer.model
    grads = []
    for compute in (
        lambda: grpo_trainer._compute_loss(model, inputs),
        lambda: flywheel_grpo_loss(model, inputs, aggregation="token_mean", beta=0.04),
    ):
        model.zero_grad()
        compute().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)


PAIRS = [
    {
        "prompt": "### Task\nWrite f(x) = x + 3.\n### Solution\n",
        "chosen": "def f(x):\n    return x + 3\n",
        "rejected": "def f(x):\n    return x + 4\n",
    },
    {
        "prompt": "### Task\nWrite g(n) = n * 2.\n### Solution\n",
        "chosen": "def g(n):\n    return n * 2\n",
        "rejected": "def g(n):\n    return n - 2\n    # done\n",
    },
    {
        "prompt": "### Task\nWrite h(a).\n### Solution\n",
        "chosen": "def h(a):\n    return a\n",
        "rejected": "def h(a): pass\n",
    },
]


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_sigmoid_loss_equals_trls(tiny_model: Path, tmp_path: Path, beta: float):
    policy, reference = policy_load(tiny_model), policy_load(tiny_model)
    # Make the policy differ from the reference, so the log-ratios are not all zero.
    with torch.no_grad():
        for parameter in policy.model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    args = TRLDPOConfig(output_dir=str(tmp_path), beta=beta, loss_type=["sigmoid"], **trl_common())
    trainer = DPOTrainer(
        model=policy.model,
        ref_model=reference.model,
        args=args,
        train_dataset=Dataset.from_list(PAIRS),
        processing_class=policy.tokenizer,
    )
    trainer.model.eval()
    batch = trainer.data_collator([trainer.train_dataset[index] for index in range(len(PAIRS))])
    theirs = trainer._compute_loss(trainer.model, batch, return_outputs=False)

    ours_batch = pair_batch(policy.tokenizer, PAIRS, apply_chat_template=False)
    with torch.no_grad():
        ref_chosen, ref_rejected = pair_logps(reference.model, ours_batch)
    ours, metrics = dpo_loss(*pair_logps(policy.model, ours_batch), ref_chosen, ref_rejected, beta=beta)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-6)
    assert metrics["reward_margin"] != 0.0
