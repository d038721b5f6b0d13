"""Hyperparameters: the ones every method takes, their types, ranges and what "auto" resolves to
(each algorithm adds its own when it registers: runs/learners.py).

Pure: the launch form, REST and the run services all validate through `resolve`, and a run
shows the resolved values it trains with.
"""

import re
from dataclasses import dataclass
from typing import Any

AUTO = "auto"
# What names a run's best checkpoint: a held-out figure run_eval writes where higher is better
# (its pass rate or mean reward, overall, per family or per grader).
BEST_METRIC = "heldout/pass_rate"
BEST_METRIC_PATTERN = r"heldout/(pass_rate|reward)(/[^\s/]{1,80})?"


@dataclass(frozen=True)
class Param:
    kind: type
    default: Any  # the value "auto" (or leaving it out) resolves to
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    help: str = ""
    pattern: str = ""  # a text value must match it whole
    expected: str = ""  # what a value that does not match is told

    def check(self, value: Any) -> str | None:
        if self.pattern:
            matches = isinstance(value, str) and re.fullmatch(self.pattern, value)
            return None if matches else f"must be {self.expected}"
        if self.choices:
            return None if value in self.choices else f"must be one of {', '.join(self.choices)}"
        if self.kind is int and (not isinstance(value, int) or isinstance(value, bool)):
            return "must be an integer"
        if self.kind is float and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            return "must be a number"
        if self.low is not None and value < self.low:
            return f"must be at least {self.low:g}"
        if self.high is not None and value > self.high:
            return f"must be at most {self.high:g}"
        return None


COMMON = {
    "learning_rate": Param(float, 3e-4, 1e-7, 1.0, help="AdamW learning rate"),
    "lr_scheduler": Param(str, "linear", choices=("linear", "constant", "constant_with_warmup", "cosine")),
    "batch_size": Param(int, 8, 1, 4096, help="task items per learner step"),
    "gradient_accumulation": Param(int, 1, 1, 1024, help="micro-batches per optimiser step"),
    "checkpoint_every": Param(int, 10, 1, 100000, help="learner steps between checkpoints"),
    "eval_every": Param(int, 10, 1, 100000, help="learner steps between held-out evaluations"),
    "eval_items": Param(int, 64, 0, 100000, help="held-out items per evaluation (0: all)"),
    "seed": Param(int, 0, 0, 2**31 - 1),
    "mixed_precision": Param(
        str, "auto", choices=("auto", "no", "bf16", "fp16"), help="auto: bf16 autocast on a GPU that has it"
    ),
    "gradient_checkpointing": Param(
        str, "off", choices=("off", "on"), help="recompute activations: less memory"
    ),
    "micro_batch_tokens": Param(
        int, 0, 0, 10**9, help="padded tokens per forward micro-batch (rows × longest); 0: no limit"
    ),
    "pass_threshold": Param(float, 1.0, help="an episode passes when its reward reaches this"),
    "eval_suite_version": Param(
        int,
        0,
        0,
        2**31 - 1,
        help="an evaluation suite version (its id) run at each held-out evaluation; 0: none",
    ),
    "adapter": Param(
        str, "none", choices=("none", "lora"), help="lora: train LoRA adapters on a frozen base"
    ),
    "lora_rank": Param(int, 8, 1, 1024, help="rank of the LoRA matrices"),
    "lora_alpha": Param(float, 16.0, 0.0, 100000.0, help="LoRA scaling numerator (scale = alpha / rank)"),
    "lora_dropout": Param(float, 0.0, 0.0, 0.9, help="dropout on the LoRA input"),
    "lora_target_modules": Param(
        str, "auto", help="auto: the family's attention and MLP projections; or names, comma-separated"
    ),
    "best_metric": Param(
        str,
        BEST_METRIC,
        pattern=BEST_METRIC_PATTERN,
        expected="a held-out metric where higher is better: heldout/pass_rate, heldout/reward, "
        "heldout/pass_rate/<family> or heldout/reward/<grader>",
        help="names the best checkpoint (ties: higher held-out reward, then the earlier step)",
    ),
}


def resolve(
    method: str, params: dict[str, Param], submitted: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """(resolved values, problems by field) of a method taking `params` (runs.learners.params_of).
    Missing or "auto" values take the default.

    >>> sizes = COMMON | {"group_size": Param(int, 8, 2, 256)}
    >>> resolved, problems = resolve("grpo", sizes, {"group_size": 4, "learning_rate": "auto"})
    >>> resolved["group_size"], resolved["learning_rate"], problems
    (4, 0.0003, {})
    >>> resolve("sft", COMMON, {"group_size": 4})[1]
    {'group_size': 'not a hyperparameter of sft'}
    >>> resolve("sft", COMMON, {"best_metric": "heldout/reward/tests"})[0]["best_metric"]
    'heldout/reward/tests'
    >>> resolve("sft", COMMON, {"best_metric": "train/pass_rate"})[1]["best_metric"][:44]
    'must be a held-out metric where higher is be'

    """
    problems = {name: f"not a hyperparameter of {method}" for name in submitted if name not in params}
    resolved = {}
    for name, param in params.items():
        value = submitted.get(name, AUTO)
        if value == AUTO:
            resolved[name] = param.default
            continue
        if param.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if (problem := param.check(value)) is not None:
            problems[name] = problem
        resolved[name] = value
    return resolved, problems
