"""GRPO as a run's method: its hyperparameters and its registration (torch-free: the web process
reads it). The learner is workers/learners/grpo.py."""

from runs.hyperparameters import Param
from runs.learners import Algorithm, algorithm_register

GRPO_PARAMS = {
    "group_size": Param(int, 8, 2, 256, help="completions sampled per item"),
    "staleness": Param(int, 1, 0, 16, help="k: learn only from trajectories of policy v-k or newer"),
    "learner_processes": Param(
        int, 0, 0, 64, help="learner processes (accelerate launch, DDP); 0: the learner worker's setting"
    ),
    "clip_epsilon": Param(float, 0.2, 0.0, 1.0, help="PPO-style clipping of the importance ratio"),
    "kl_coef": Param(float, 0.0, 0.0, 10.0, help="weight of the KL penalty to the reference policy"),
    "loss_aggregation": Param(str, "token_mean", choices=("token_mean", "sequence_mean", "dr_grpo")),
    "scale_rewards": Param(str, "group", choices=("group", "none")),
    "tis_cap": Param(
        float,
        0.0,
        0.0,
        100.0,
        help="truncated importance sampling: weigh each token by min(learner p / decoder p, this), "
        "correcting for a decoder in another precision or engine (2 is common); 0: off",
    ),
    "episode_deadline_seconds": Param(float, 120.0, 1.0, 86400.0, help="stragglers are cut off here"),
}

GRPO = algorithm_register(
    Algorithm(
        name="grpo",
        label="GRPO",
        summary="group-relative policy optimisation on the run's own rollouts, scored by its reward rule",
        learner="workers.learners.grpo",
        params=GRPO_PARAMS,
        online=True,
        distributed=True,
    )
)

EXTERNAL_ROLLOUTS = algorithm_register(
    Algorithm(
        name="external_rollouts",
        label="GRPO on external agents",
        summary="GRPO on episodes that agents outside Flywheel play against the run's policy on "
        "/v1/chat/completions (model run-<id>), taking tasks from the run's episodes endpoint and "
        "reporting each outcome",
        learner="workers.learners.grpo",
        params=GRPO_PARAMS,
        online=True,
        distributed=True,
        rollouts="external",
    )
)
