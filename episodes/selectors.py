"""Reads: a run's policy as a served model (`run-<id>`), episodes as their caller may see them."""

import re

from django.contrib.auth.models import User
from django.db.models import Count, QuerySet

from core.artifacts import artifact_exists
from core.roles import Permission
from episodes.models import Episode
from projects import selectors as project_selectors
from runs import selectors as run_selectors
from runs.learners import algorithm_names, plays_external
from runs.models import Run
from runs.run_store import policy_dir, policy_prefix
from serving.served_models import ServedModel

RUN_POLICY_ID = re.compile(r"^run-(\d{1,18})$")


def run_policy_model_for(*, user: User, model_id: str, fetch: bool = False) -> ServedModel | None:
    """`run-<id>`: the run's newest published policy version, for a caller who may view the run. An
    agent playing the run's episodes calls this name; each request is answered by the version
    published when it arrives (recorded with the turn)."""
    match = RUN_POLICY_ID.match(model_id)
    if match is None:
        return None
    run = Run.objects.select_related("project").filter(pk=int(match[1])).first()
    if run is None or not run_selectors.role_allows(
        project_selectors.role_of(user=user, project_id=run.project_id), Permission.VIEW
    ):
        return None
    if not artifact_exists(policy_prefix(run.pk, run.policy_version)):
        return None  # nothing published yet: the learner is still starting
    return _policy_model(run, fetch=fetch)


def _policy_model(run: Run, *, fetch: bool = False) -> ServedModel:
    return ServedModel(
        id=f"run-{run.pk}",
        name=f"{run.name} (newest policy, v{run.policy_version})",
        kind="policy",
        project_id=run.project_id,
        project=run.project.name,
        created=int(run.created_at.timestamp()),
        source=policy_dir(run.pk, run.policy_version) if fetch else None,
        config=dict(run.tier_config),
        policy_version=run.policy_version,
    )


def run_policy_models_for(*, user: User) -> list[ServedModel]:
    """`run-<id>` of every running external_rollouts run the caller may view (listed in /v1/models,
    which some agent frameworks read before they call a model)."""
    runs = Run.objects.filter(
        project_id__in=project_selectors.visible_project_ids(user=user),
        status=Run.Status.RUNNING,
        method__in=[name for name in algorithm_names() if plays_external(name)],
    ).select_related("project")
    return [_policy_model(run) for run in runs.order_by("-created_at", "-pk")]


def episodes_of(*, run: Run, status: str | None = None) -> QuerySet[Episode]:
    episodes = Episode.objects.filter(run=run).select_related("item")
    return episodes.filter(status=status) if status else episodes


def episode_counts(*, run: Run) -> dict[str, int]:
    """How many of the run's episodes are in each state (every state named, zeros included)."""
    counted = dict(Episode.objects.filter(run=run).values_list("status").annotate(n=Count("pk")))
    return {status: counted.get(status, 0) for status in Episode.Status.values}


def episode_for(*, user: User, run: Run, key: str) -> Episode:
    """The run's episode by its key (Episode.DoesNotExist otherwise); the caller already holds the
    run through its role."""
    return Episode.objects.select_related("run", "item", "batch").get(run=run, key=key)
