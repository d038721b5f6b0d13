"""A reward model's hyperparameters: types, ranges and what "auto" resolves to (runs' Param)."""

from typing import Any

from runs.hyperparameters import AUTO, Param

PARAMS: dict[str, Param] = {
    "learning_rate": Param(float, 1e-4, 1e-7, 1.0, help="AdamW learning rate"),
    "lr_scheduler": Param(str, "linear", choices=("linear", "constant", "constant_with_warmup", "cosine")),
    "batch_size": Param(int, 8, 1, 4096, help="pairs per optimiser step"),
    "gradient_accumulation": Param(int, 1, 1, 1024, help="micro-batches per optimiser step"),
    "epochs": Param(int, 1, 1, 1000, help="passes over the training pairs"),
    "max_steps": Param(int, 1000, 1, 1_000_000, help="at most this many steps, whatever the epochs"),
    "seed": Param(int, 0, 0, 2**31 - 1),
    "center_rewards_coefficient": Param(float, 0.0, 0.0, 10.0, help="pulls rewards towards 0"),
    "max_length": Param(int, 1024, 16, 32768, help="tokens per row; longer prompts lose their start"),
    "heldout_fraction": Param(
        float, 0.2, 0.0, 0.9, help="pairs held out when the task set's held-out split has none"
    ),
}


def resolve(submitted: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(resolved values, problems by field); missing or "auto" values take their default.

    >>> resolve({"batch_size": 4})[0]["batch_size"], resolve({"beta": 1})[1]
    (4, {'beta': 'not a hyperparameter of a reward model'})
    """
    problems = {name: "not a hyperparameter of a reward model" for name in submitted if name not in PARAMS}
    resolved = {}
    for name, param in PARAMS.items():
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
