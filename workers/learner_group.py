"""A run's learner on several processes (`accelerate launch`, DDP): rank 0 leads, the others follow.

Rank 0 runs the loop of `run_learner` alone: it dispatches and waits for rollouts, writes every row
of the database, publishes policy versions and uploads checkpoints. At each step it broadcasts the
step's episodes (with their advantages) to the other ranks; every rank builds the same batch and
learns on its share of the rows, DDP averaging the gradients. Checkpoints are taken by all ranks
together (Accelerate saves each rank's RNG state); a "stop" ends the followers. A rank that dies
takes the group down (torch's launcher stops the others), and the supervisor restarts the whole
group from the last checkpoint.

Same global batch, same weights: with P processes and gradient accumulation g, each process runs g
micro-batches of its 1/P of the rows, which is the 1-process run with accumulation P × g (exactly
when the rows divide evenly; float rounding aside).
"""

import os
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from workers.learners.common import Learner, checkpoint_save
from workers.learners.grpo import GRPOBatch, GRPOConfig, grpo_batch, learn_on_batch

# Followers wait in a broadcast while rank 0 waits for a step's rollouts: for as long as that takes.
GROUP_TIMEOUT = timedelta(hours=24)


def group_init() -> None:
    """Under a launcher (WORLD_SIZE > 1), open the process group with a long timeout before
    Accelerate does, so followers may wait on rank 0 for a slow step; gloo on CPUs."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or torch.distributed.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.distributed.init_process_group(backend=backend, timeout=GROUP_TIMEOUT)


def group_prepare(learner: Learner) -> None:
    """One learner step is one optimiser step over the global batch, however many processes share
    it: the learning-rate schedule advances once per step (Accelerate's default for data loaders it
    did not split is num_processes times)."""
    learner.scheduler.split_batches = True


def group_command(accelerator: Accelerator, op: str, **data) -> dict:
    """Rank 0 sends a command (the others receive it by calling this with op=""); a no-op alone."""
    if accelerator.num_processes <= 1:
        return {"op": op, **data}
    box = [{"op": op, **data} if accelerator.is_main_process else None]
    broadcast_object_list(box, from_process=0)
    command = box[0]
    assert command is not None, "the broadcast gives every rank rank 0's command"
    return command


def group_batch(
    accelerator: Accelerator, episodes: list, keep: list[int], advantages: torch.Tensor, pad_token_id: int
) -> GRPOBatch:
    """Rank 0: send the step's episodes to the group and return this rank's share of the batch."""
    command = group_command(accelerator, "learn", episodes=episodes, keep=keep, advantages=advantages)
    return _share(
        accelerator, grpo_batch(command["episodes"], command["keep"], command["advantages"], pad_token_id)
    )


def group_checkpoint(learner: Learner) -> None:
    """Rank 0: the followers save their part of the checkpoint now, with it."""
    group_command(learner.accelerator, "checkpoint", step=learner.state.step)


def group_stop(accelerator: Accelerator) -> None:
    group_command(accelerator, "stop")


def group_follow(learner: Learner, config: GRPOConfig, reference, pad_token_id: int) -> None:
    """A follower's loop: learn its share of each step, checkpoint with rank 0, stop when told."""
    while True:
        command = group_command(learner.accelerator, "")
        if command["op"] == "stop":
            return
        if command["op"] == "checkpoint":
            learner.state.step = command["step"]
            checkpoint_save(learner, config)
        elif command["op"] == "learn":
            batch = grpo_batch(command["episodes"], command["keep"], command["advantages"], pad_token_id)
            learner.model.train()
            learn_on_batch(learner, _share(learner.accelerator, batch), config, reference)
            learner.state.step += 1
        else:
            raise ValueError(f"unknown learner group command {command['op']!r}")


def _share(accelerator: Accelerator, batch: GRPOBatch) -> GRPOBatch:
    """This rank's contiguous share of the rows. Every rank must run a backward pass in each
    micro-batch (DDP all-reduces there), so a batch with fewer rows than ranks × micro-batches is
    padded with copies of its first row at advantage 0 (no gradient without a KL term)."""
    ranks = accelerator.num_processes
    if ranks <= 1:
        return batch
    rows = torch.arange(len(batch.advantages))
    needed = ranks * accelerator.gradient_accumulation_steps
    if len(rows) < needed:
        rows = torch.cat([rows, torch.zeros(needed - len(rows), dtype=rows.dtype)])
    mine = rows.tensor_split(ranks)[accelerator.process_index]
    advantages = batch.advantages[mine].clone()
    padded = torch.arange(len(rows)).tensor_split(ranks)[accelerator.process_index] >= len(batch.advantages)
    advantages[padded] = 0.0
    return GRPOBatch(batch.sequences.rows(mine), batch.old_logprobs[mine], advantages)
