"""An evaluation suite's evaluation, on the eval queue (evaluations/tasks.py claims it, then calls
`suite_evaluation_run`).

The target is loaded once: a run's policy version (or checkpoint) prepared the run's tier's way,
or a tier as it is (its base model under its settings, an engine tier on its engine). Then, entry by
entry, each item is sampled n times at the suite's temperature (greedy by default) with the same
generation, agent and grading code as the rollouts and the held-out evaluation
(`inference.decoding.decode`, `workers.agent.episodes_play`, `workers.run_rollout.grade`),
scored by the entry's reward rule, and kept per item: samples, passes, rewards, each grader's mean,
tokens, invalid actions and the first completions. The figures (evaluations/metrics.py) are
stored per entry and overall.
"""

import logging
import traceback
from collections import defaultdict
from dataclasses import dataclass
from statistics import fmean

import torch

from evaluations import services
from evaluations.metrics import ItemFigures, figures
from evaluations.models import SuiteEntry, SuiteEvaluation, SuiteResult
from inference.chat import item_prompt
from inference.decoding import TierError, TierModel, decode, tier_load
from inference.engines import EngineTier
from inference.settings import TierSettings
from rewards.engine import ScoreResult
from rewards.services import project_judge, project_reward_models
from workers.agent import context_fits, episodes_play, policy_render
from workers.run_rollout import agent_sessions, grade, item_dicts, policy_version_load, storable

logger = logging.getLogger(__name__)
COMPLETIONS_KEPT = 4  # per item: enough to read what earned the figure
COMPLETION_CHARS = 20_000
SEED = 0


@dataclass(frozen=True)
class Sampled:
    """One sample of one item: its text, tokens, grade and, for an agent, its invalid actions."""

    text: str
    tokens: int
    grade: ScoreResult | None
    invalid_actions: int | None = None
    steps: int | None = None
    error: str | None = None

    @property
    def reward(self) -> float | None:
        """The grade's total; None when the sample errored (an error, no grade, a grader's error)."""
        if self.error is not None or self.grade is None or self.grade.errored:
            return None
        return self.grade.total

    @property
    def errored(self) -> bool:
        return self.reward is None


def decoding(config: dict, sampling: dict) -> TierSettings:
    """The target's tier settings at the suite's temperature (greedy: no top-p or top-k either)."""
    settings = TierSettings.from_config(config)
    temperature = float(sampling["temperature"])
    if temperature == 0:
        return settings.with_(temperature=0.0, top_p=1.0, top_k=0)
    return settings.with_(temperature=temperature)


def target_load(evaluation: SuiteEvaluation, settings: TierSettings) -> TierModel | EngineTier:
    """The model to sample from: a run's policy version the run's way, or a tier's base model."""
    run, version = evaluation.run, evaluation.policy_version
    if run is None:
        return tier_load(settings, evaluation.model)
    if version is None:
        raise TierError(f"the evaluation of run {run.pk} names no policy version to load")
    return policy_version_load(run, version, settings)


def samples_of(
    policy, items: list[dict], settings: TierSettings, n: int, spec: dict, *, judge, reward_models, generator
):
    """n samples of each item, graded with `spec`: short items from one completion, agent items
    from a played episode. Returns, per item, its samples."""
    out: dict[int, list[Sampled]] = defaultdict(list)
    short = [index for index, item in enumerate(items) if item["kind"] != "agent"]
    if short:
        repeated = [index for index in short for _ in range(n)]
        prompts = [policy.prompt_text(item_prompt(items[index])) for index in repeated]
        completions = decode(policy, prompts, settings, generator=generator)
        texts = [completion.text for completion in completions]
        grades = grade(spec, [items[i] for i in repeated], texts, judge=judge, reward_models=reward_models)
        for index, completion, result in zip(repeated, completions, grades, strict=True):
            out[index].append(Sampled(completion.text, len(completion.token_ids), result))
    agents = [index for index, item in enumerate(items) if item["kind"] == "agent"]
    if agents:
        repeated = [index for index in agents for _ in range(n)]
        episodes = episodes_play(
            [items[index] for index in repeated],
            lambda prompts: decode(policy, prompts, settings, generator=generator),
            rule=spec,
            render=policy_render(policy, chat=settings.chat),
            fits=context_fits(policy, settings.max_new_tokens),
            sessions=agent_sessions(policy, settings, generator),
            judge=judge,
        )
        for index, episode in zip(repeated, episodes, strict=True):
            out[index].append(
                Sampled(
                    "\n".join(turn.completion.text for turn in episode.turns),
                    sum(len(turn.completion.token_ids) for turn in episode.turns),
                    episode.grade,
                    invalid_actions=episode.invalid_actions,
                    steps=len(episode.turns),
                    error=episode.error,
                )
            )
    return [out[index] for index in range(len(items))]


def item_figures(samples: list[Sampled], threshold: float, agent: bool) -> ItemFigures:
    # (sample, score, reward) of each sample that did not error
    graded = [
        (sample, sample.grade, reward)
        for sample in samples
        if sample.grade is not None and (reward := sample.reward) is not None
    ]
    components: dict[str, list[float]] = defaultdict(list)
    for _, score, _ in graded:
        for name, value in score.components.items():
            if value is not None:
                components[name].append(value)
    return ItemFigures(
        samples=len(graded),
        passes=sum(reward >= threshold for _, _, reward in graded),
        rewards=[reward for _, _, reward in graded],
        graders={name: fmean(values) for name, values in components.items()} if len(components) > 1 else {},
        tokens=[sample.tokens for sample, _, _ in graded],
        invalid_actions=sum(s.invalid_actions or 0 for s in samples) if agent else None,
        steps=sum(s.steps or 0 for s in samples) if agent else None,
        errored=len(samples) - len(graded),
    )


def completion_record(sample: Sampled, threshold: float) -> dict:
    reward = sample.reward
    record = {
        "text": storable(sample.text[:COMPLETION_CHARS]),
        "tokens": sample.tokens,
        "reward": reward,
        "passed": reward is not None and reward >= threshold,
        "errored": reward is None,
    }
    if sample.invalid_actions is not None:
        record["invalid_actions"] = sample.invalid_actions
    if sample.error:
        record["error"] = storable(sample.error[:2000])
    return record


def result_row(
    evaluation: SuiteEvaluation, entry: SuiteEntry, item: dict, fig: ItemFigures, samples, threshold
):
    return SuiteResult(
        evaluation=evaluation,
        entry=entry.position,
        item_id=item["pk"],
        samples=fig.samples,
        passes=fig.passes,
        errored=fig.errored,
        reward_mean=fmean(fig.rewards) if fig.rewards else None,
        grader_means=fig.graders,
        completion_tokens_mean=fmean(fig.tokens) if fig.tokens else None,
        invalid_actions=fig.invalid_actions,
        agent_steps=fig.steps,
        completions=[completion_record(sample, threshold) for sample in samples[:COMPLETIONS_KEPT]],
    )


def entry_items(entry: SuiteEntry) -> list[dict]:
    ids = (
        entry.task_set_version.items.filter(split=entry.split)
        .order_by("position")
        .values_list("pk", flat=True)
    )
    return item_dicts(list(ids[: entry.limit] if entry.limit else ids))


def entry_label(entry: SuiteEntry) -> dict:
    return {
        "entry": entry.position,
        "task_set": entry.task_set_version.task_set.name,
        "task_set_version": entry.task_set_version_id,
        "split": entry.split,
        "reward_rule_version": entry.reward_rule_version_id,
    }


def suite_evaluation_run(evaluation: SuiteEvaluation) -> None:
    """Evaluate a claimed evaluation and record it: succeeded with its figures, or failed with the
    reason (a target that cannot be loaded, a rule that cannot run)."""
    sampling = evaluation.suite_version.sampling
    n, ks, threshold = int(sampling["samples"]), list(sampling["k"]), float(sampling["pass_threshold"])
    entries = evaluation.suite_version.entries.select_related(
        "task_set_version__task_set", "reward_rule_version"
    )
    try:
        settings = decoding(evaluation.tier_config, sampling)
        policy = target_load(evaluation, settings)
        judge, reward_models = project_judge(evaluation.project), project_reward_models(evaluation.project)
        generator = torch.Generator().manual_seed(SEED)
        every: list[ItemFigures] = []
        per_entry = []
        for entry in entries:
            items = entry_items(entry)
            sampled = samples_of(
                policy,
                items,
                settings,
                n,
                entry.reward_rule_version.spec,
                judge=judge,
                reward_models=reward_models,
                generator=generator,
            )
            figs = [
                item_figures(s, threshold, item["kind"] == "agent")
                for item, s in zip(items, sampled, strict=True)
            ]
            rows = [
                result_row(evaluation, entry, item, fig, s, threshold)
                for item, fig, s in zip(items, figs, sampled, strict=True)
            ]
            services.suite_results_record(evaluation=evaluation, results=rows)
            per_entry.append(entry_label(entry) | figures(figs, ks))
            every += figs
        metrics = {"overall": figures(every, ks), "entries": per_entry}
        services.suite_evaluation_finish(evaluation=evaluation, metrics=metrics)
    except Exception as exc:  # noqa: BLE001 - any failure ends the evaluation as failed, with its reason
        logger.exception("suite evaluation %s failed", evaluation.pk)
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
        services.suite_evaluation_finish(evaluation=evaluation, metrics={}, error=error)
