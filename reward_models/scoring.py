"""The scorer behind `reward_model` graders: names a project's reward model (and version) the way a
rule does, and scores (prompt, completion) pairs with it in batches.

`reward_models_scorer(project_id)` answers `scorer(name, number, prompts, completions) -> scores`.
With a run, the version is pinned on first use (`RunRewardModel`), so a rule that names a model
without a version scores the whole run with the version that was newest when the run began to
score, and the run's page links it. Models (and torch) load on the first score only, once per
process, and stay loaded.
"""

import threading
from collections import OrderedDict

from django.db import IntegrityError, transaction

from core.exceptions import StateError
from reward_models import selectors
from reward_models.models import RewardModelVersion, RunRewardModel
from reward_models.store import model_local
from rewards.graders.reward_model import Scorer

LOADED_MAX = 4
_loaded: OrderedDict[str, object] = OrderedDict()
_load_lock = threading.Lock()


class RewardModelMissingError(LookupError):
    """The project has no trained version of the named reward model (at that number)."""


def loaded_scorer(path: str):
    """The reward model saved at `path`, loaded once per process (the newest few stay loaded)."""
    with _load_lock:
        if path in _loaded:
            _loaded.move_to_end(path)
            return _loaded[path]
        from inference.reward_model import RewardScorer  # torch loads here, on a first score only

        scorer = RewardScorer.load(path)
        _loaded[path] = scorer
        while len(_loaded) > LOADED_MAX:
            _loaded.popitem(last=False)
        return scorer


def _pinned(run_id: int, version: RewardModelVersion) -> RewardModelVersion:
    """The version this run uses for the model: the first one it resolved, recorded."""
    use = (
        RunRewardModel.objects.filter(run_id=run_id, reward_model=version.reward_model)
        .select_related("version")
        .first()
    )
    if use is not None:
        return use.version
    try:
        with transaction.atomic():
            RunRewardModel.objects.create(run_id=run_id, reward_model=version.reward_model, version=version)
    except IntegrityError:  # another worker of the run pinned it first: use theirs
        return (
            RunRewardModel.objects.select_related("version")
            .get(run_id=run_id, reward_model=version.reward_model)
            .version
        )
    return version


def reward_models_scorer(project_id: int, *, run_id: int | None = None) -> Scorer:
    resolved: dict[tuple[str, int | None], RewardModelVersion] = {}
    lock = threading.Lock()

    def resolve(name: str, number: int | None) -> RewardModelVersion:
        with lock:
            if (name, number) not in resolved:
                if run_id is not None and number is None:
                    use = (
                        RunRewardModel.objects.filter(run_id=run_id, reward_model__name=name)
                        .select_related("version__reward_model")
                        .first()
                    )
                    if use is not None:
                        resolved[(name, number)] = use.version
                        return use.version
                version = selectors.trained_version(project_id=project_id, name=name, number=number)
                if version is None:
                    which = f"version {number} of " if number is not None else "trained version of "
                    raise RewardModelMissingError(f"the project has no {which}reward model {name!r}")
                if run_id is not None:
                    pinned = _pinned(run_id, version)  # a rule naming its version gets exactly that one
                    version = pinned if number is None else version
                resolved[(name, number)] = version
            return resolved[(name, number)]

    def scorer(name: str, number: int | None, prompts: list, completions: list) -> list[float]:
        version = resolve(name, number)
        return loaded_scorer(model_local(version.path)).scores(prompts, completions)

    return scorer


def version_score(
    *, version: RewardModelVersion, texts: list[dict] | None = None, pairs: list[dict] | None = None
):
    """REST's scoring: raw scores of `texts` ({prompt, completion}), or each pair of `pairs` ranked
    ({prompt, chosen, rejected}), with the trained version (loaded once per process)."""
    if version.status != RewardModelVersion.Status.SUCCEEDED or not version.path:
        raise StateError(f"version {version.number} is {version.status}; only a trained version scores")
    scorer = loaded_scorer(model_local(version.path))
    out = {"reward_model": version.reward_model_id, "version": version.pk, "number": version.number}
    if texts is not None:
        scores = scorer.scores([t["prompt"] for t in texts], [t["completion"] for t in texts])
        return out | {"scores": scores}
    pairs = pairs or []
    prompts = [pair["prompt"] for pair in pairs]
    both = scorer.scores(prompts + prompts, [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs])
    chosen, rejected = both[: len(pairs)], both[len(pairs) :]
    ranked = [
        {"chosen": c, "rejected": r, "margin": c - r, "prefers_chosen": c > r}
        for c, r in zip(chosen, rejected, strict=True)
    ]
    return out | {"pairs": ranked, "accuracy": sum(p["prefers_chosen"] for p in ranked) / len(ranked)}
