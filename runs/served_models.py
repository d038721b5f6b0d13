"""What the OpenAI-compatible endpoint and the playground serve: every tier (its base model under
its settings) and every checkpoint (the policy version saved at its step, under its run's tier
settings as they were at launch) of the caller's projects. Reads only, through the caller's role.

Model ids: `tier-<id>` and `run-<run id>-step-<step>`.
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from inference.settings import model_source, tier_snapshot
from runs import selectors
from runs.artifacts import ArtifactMissingError
from runs.models import Checkpoint, Tier
from runs.roles import Permission
from runs.run_store import policy_dir

TIER_ID = re.compile(r"^tier-(\d{1,18})$")
CHECKPOINT_ID = re.compile(r"^run-(\d{1,18})-step-(\d{1,18})$")
MAX_CHECKPOINTS_LISTED = 200


class UnknownModelError(LookupError):
    """No model by that id that the caller may use."""


@dataclass
class ServedModel:
    id: str
    name: str  # what a person reads: the tier's name, or the run's name and step
    kind: str  # "tier" or "checkpoint"
    project_id: int
    project: str
    created: int
    source: str | Path | None  # what from_pretrained opens (None in a listing: not fetched)
    config: dict[str, Any]  # the tier settings it decodes with

    def card(self) -> dict[str, Any]:
        """The model object of /v1/models, with Flywheel's own facts beside OpenAI's fields."""
        return {
            "id": self.id,
            "object": "model",
            "created": self.created,
            "owned_by": self.project,
            "flywheel": {"name": self.name, "kind": self.kind, "project": self.project_id},
        }


def tier_model(tier: Tier) -> ServedModel:
    return ServedModel(
        id=f"tier-{tier.pk}",
        name=tier.name,
        kind="tier",
        project_id=tier.project_id,
        project=tier.project.name,
        created=int(tier.created_at.timestamp()),
        source=model_source(tier.base_model),
        config=tier_snapshot(tier),
    )


def checkpoint_model(checkpoint: Checkpoint, *, fetch: bool = False) -> ServedModel:
    """The checkpoint as a served model; `fetch` brings its weights into this host's cache (a
    listing never does: it would download every version it names)."""
    run = checkpoint.run
    return ServedModel(
        id=f"run-{run.pk}-step-{checkpoint.step}",
        name=f"{run.name} @ step {checkpoint.step}",
        kind="checkpoint",
        project_id=run.project_id,
        project=run.project.name,
        created=int(checkpoint.created_at.timestamp()),
        source=policy_dir(run.pk, checkpoint.policy_version) if fetch else None,
        config=dict(run.tier_config),
    )


def served_models_for(*, user: AbstractBaseUser) -> list[ServedModel]:
    """The caller's tiers (by project, then name), then their newest checkpoints."""
    tiers = selectors.tiers_for(user=user).order_by("project__name", "name", "pk")
    checkpoints = (
        selectors.checkpoints_for(user=user)
        .select_related("run__project")
        .order_by("-created_at", "-pk")[:MAX_CHECKPOINTS_LISTED]
    )
    return [tier_model(tier) for tier in tiers] + [checkpoint_model(c) for c in checkpoints]


def served_model_for(*, user: AbstractBaseUser, model_id: str, fetch: bool = False) -> ServedModel:
    """The model by id, if the caller's role lets them use it; UnknownModelError otherwise (a model of a
    project the caller is not in is reported as absent, as everywhere). `fetch`: a checkpoint's
    weights brought into this host's cache, to generate with."""
    if match := TIER_ID.match(model_id):
        tier = Tier.objects.select_related("project").filter(pk=int(match[1])).first()
        if tier is not None and selectors.role_allows(
            selectors.role_of(user=user, project_id=tier.project_id), Permission.VIEW
        ):
            return tier_model(tier)
    elif match := CHECKPOINT_ID.match(model_id):
        checkpoint = (
            Checkpoint.objects.select_related("run__project")
            .filter(run_id=int(match[1]), step=int(match[2]))
            .first()
        )
        if checkpoint is not None and selectors.role_allows(
            selectors.role_of(user=user, project_id=checkpoint.run.project_id), Permission.VIEW
        ):
            try:
                return checkpoint_model(checkpoint, fetch=fetch)
            except ArtifactMissingError:
                raise UnknownModelError(
                    f"The weights of `{model_id}` are no longer in the artifact storage."
                ) from None
    raise UnknownModelError(f"The model `{model_id}` does not exist or you do not have access to it.")
