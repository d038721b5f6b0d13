"""The reward_model grader: a trained reward model (reward_models app) scores the completion.

    {"type": "reward_model", "name": "rm", "model": "helpful", "version": 2,
     "input": "{{ sample.output_text }}", "prompt": "{{ item.prompt }}"}

`model` names one of the project's reward models; `version` fixes one of its trained versions (left
out: the newest, pinned for a run when the run first scores). `input` is the completion judged and
`prompt` what it answers (defaults: the sample's output text and the item's prompt). The score is
the model's scalar: unbounded, higher for what the preference pairs preferred; a formula can
squash or weight it (`1 / (1 + exp(-rm))`).

Scoring a batch (score_batch: a rollout batch, a dry-run) runs one forward pass per model for every
sample; the model loads on the first score in each process, and torch with it, never before. No
scorer here, or no trained version of that name: an infrastructure problem, the sample is errored.
"""

from collections.abc import Callable, Sequence
from typing import Any

from rewards.graders.base import TEXT, Field, GradingError, grader

# scorer(name, version, prompts, completions) -> scores
Scorer = Callable[[str, "int | None", list, list], list[float]]
# (project id, run id or None) -> the project's scorer. The reward_models app, built above rewards,
# registers its factory in its AppConfig.ready; rewards imports nothing of it.
SCORER_FACTORIES: list[Callable[..., Scorer]] = []


def scorer_factory_register(factory: Callable[..., Scorer]) -> None:
    if factory not in SCORER_FACTORIES:
        SCORER_FACTORIES.append(factory)


def project_scorer(project_id: int, *, run_id: int | None = None) -> Scorer | None:
    """The registered scorer for the project's reward models; None when no app provides one (the
    grader then errors the sample as an infrastructure problem)."""
    for factory in SCORER_FACTORIES:
        return factory(project_id, run_id=run_id)
    return None


def check_version(spec: dict) -> list[tuple[str, str]]:
    version = spec.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version < 1:
        return [("version", "must be a version number, 1 or more")]
    if isinstance(spec.get("model"), str) and not spec["model"].strip():
        return [("model", "names one of the project's reward models")]
    return []


def _texts(context: Any, input: str | None, prompt: str | None) -> tuple[Any, str]:
    completion = input if input is not None else context.sample.output_text
    return (prompt if prompt is not None else context.item.get("prompt", "")), completion


def _scores(context: Any, model: str, version: int | None, prompts: list, completions: list) -> list[float]:
    if context.reward_models is None:
        raise GradingError("unsupported", "no reward models can score here", errored=True)
    try:
        return [float(value) for value in context.reward_models(model, version, prompts, completions)]
    except LookupError as exc:  # no trained version of that name
        raise GradingError("grader_exception", str(exc), errored=True) from None
    except GradingError:
        raise
    except Exception as exc:  # noqa: BLE001  (the model failed to load or run: infrastructure)
        raise GradingError(
            "grader_exception", f"the reward model {model!r} failed: {exc}", errored=True
        ) from None


def reward_model_batch(arguments: list[dict], contexts: list) -> list:
    """Every sample's score, one scorer call per (model, version) named."""
    groups: dict[tuple[str, int | None], list[int]] = {}
    for index, kwargs in enumerate(arguments):
        groups.setdefault((kwargs["model"], kwargs.get("version")), []).append(index)
    out: list = [None] * len(arguments)
    for (model, version), indexes in groups.items():
        texts = [_texts(contexts[i], arguments[i].get("input"), arguments[i].get("prompt")) for i in indexes]
        scores: Sequence[float | GradingError]  # a failure stands for each of the group's values
        try:
            scores = _scores(
                contexts[indexes[0]], model, version, [t[0] for t in texts], [t[1] for t in texts]
            )
        except GradingError as failure:
            scores = [failure] * len(indexes)
        for index, value in zip(indexes, scores, strict=True):
            out[index] = value
    return out


@grader(
    "reward_model",
    check=check_version,
    uses_reward_model=True,
    batch=reward_model_batch,
    model=Field(str),
    version=Field(int, required=False),
    input=Field(str, required=False, form=TEXT),
    prompt=Field(str, required=False, form=TEXT),
)
def reward_model(
    context: Any, model: str, version: int | None = None, input: str | None = None, prompt: str | None = None
) -> float:
    """The score a trained reward model gives the completion (higher: preferred).

    >>> from rewards.graders.base import Context, Sample
    >>> scorer = lambda name, version, prompts, completions: [float(len(c)) for c in completions]
    >>> context = Context({"prompt": "Say hi"}, Sample(output_text="hello"), reward_models=scorer)
    >>> reward_model(context, "helpful")
    5.0
    """
    prompt_text, completion = _texts(context, input, prompt)
    return _scores(context, model, version, [prompt_text], [completion])[0]
