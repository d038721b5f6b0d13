"""Which monitors a run has and how they are set: the thresholds (defaults, and a run's overrides)
and each monitor's action, validated by name. Kept apart from the monitors themselves
(runs/monitors.py), which act through the run lifecycle: the lifecycle validates these settings at
launch, so it imports this light module and the monitors import the lifecycle."""

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError

from runs.models import Run

DEFAULTS: dict[str, float] = {
    "window": 5,  # points per window: the recent one and the baseline at the run's start
    "errored_rate_max": 0.2,  # episodes/errored_rate above this fires
    "reward_rise_min": 0.1,  # train reward rising at least this much over the window...
    "heldout_flat_max": 0.02,  # ...while held-out pass rate moves less than this
    "response_drift_max": 0.5,  # response length moved by more than this fraction of its baseline
    "entropy_drop_max": 0.75,  # entropy lost more than this fraction of its baseline
    "zero_variance_share_max": 0.5,  # share of groups dropped for equal rewards above this, rising
    "hacking_flags_min": 3,  # this many newly flagged trajectories in the window fire...
    "hacking_share_min": 0.05,  # ...when they are at least this share of the window's episodes
    "flagged_rate_max": 0.25,  # share of a step's episodes flagged by the detectors above this fires
    "nothing_learned_steps": 5,  # this many steps in a row with no episode learned from fires
    "mismatch_kl_max": 0.05,  # KL(decoder ‖ learner) on the sampled tokens above this, window mean, fires
    "cooldown_steps": 10,
}
HELP: dict[str, str] = {
    "window": "points in each window compared (recent against the run's start)",
    "errored_rate_max": "errored-episode rate above which an alert fires",
    "reward_rise_min": "rise of train reward over the window that counts as rising",
    "heldout_flat_max": "held-out pass-rate change at most this counts as flat",
    "response_drift_max": "relative change of response length from its baseline that fires",
    "entropy_drop_max": "fraction of its baseline entropy lost that counts as collapse",
    "zero_variance_share_max": "share of zero-variance groups above which a rising share fires",
    "hacking_flags_min": "newly flagged trajectories (reward-hacking detectors) in the window that fire",
    "hacking_share_min": "share of the window's episodes those flagged trajectories must reach to fire",
    "flagged_rate_max": "share of a step's episodes flagged by the reward-hacking detectors that fires",
    "nothing_learned_steps": "steps in a row without a single learnable episode that fire",
    "mismatch_kl_max": "KL between the decoder's and the learner's log-probs (recent window mean) that fires",
    "cooldown_steps": "steps before the same monitor may fire again",
}
INTEGER = {"window", "hacking_flags_min", "cooldown_steps", "nothing_learned_steps"}

# The monitors, by the name their alerts carry, and what each watches.
MONITORS: dict[str, str] = {
    "errored_rate": "errored-episode rate above its threshold",
    "reward_without_heldout": "train reward rising while held-out pass rate stays flat",
    "response_length_drift": "response length drifting from its baseline",
    "entropy_collapse": "policy entropy collapsing",
    "zero_variance_groups": "a growing share of groups whose rewards do not vary",
    "reward_hacking": "a share of recent trajectories newly flagged by the reward-hacking detectors",
    "hacking_rate": "the share of a step's episodes that the reward-hacking detectors flag",
    "nothing_to_learn": "steps in a row in which no episode could be learned from",
    "logprob_mismatch": "the decoder's and the learner's log-probs of the sampled tokens drifting apart",
}
ACTIONS = ("alert", "pause", "stop")
DEFAULT_ACTIONS: dict[str, str] = {"nothing_to_learn": "stop"}


def thresholds_of(run: Run) -> dict[str, float]:
    return DEFAULTS | (run.monitors or {})


def default_action(name: str) -> str:
    return DEFAULT_ACTIONS.get(name, "alert")


def actions_of(run: Run) -> dict[str, str]:
    """Every monitor's action for this run: what the run says, else the monitor's default."""
    return {name: (run.monitor_actions or {}).get(name, default_action(name)) for name in MONITORS}


def actions_clean(values: Mapping[str, Any]) -> dict[str, str]:
    """Validated per-monitor actions, refused by name."""
    problems = {}
    for name, action in values.items():
        if name not in MONITORS:
            problems[f"actions.{name}"] = f"unknown monitor; known: {', '.join(MONITORS)}"
        elif action not in ACTIONS:
            problems[f"actions.{name}"] = f"must be one of {', '.join(ACTIONS)}"
    if problems:
        raise ValidationError(problems)
    return {name: action for name, action in values.items() if action != default_action(name)}


def thresholds_clean(values: Mapping[str, Any]) -> dict[str, float]:
    """Validated overrides: known names, non-negative numbers (whole ones where counted)."""
    problems, clean = {}, {}
    for name, value in values.items():
        if name not in DEFAULTS:
            problems[name] = f"unknown monitor setting; known: {', '.join(sorted(DEFAULTS))}"
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            problems[name] = "must be a number, 0 or more"
        elif name in INTEGER and (int(value) != value or value < 1):
            problems[name] = "must be a whole number, 1 or more"
        else:
            clean[name] = int(value) if name in INTEGER else float(value)
    if problems:
        raise ValidationError(problems)
    return clean
