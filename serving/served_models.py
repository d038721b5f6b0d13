"""What the OpenAI-compatible endpoint and the playground serve: every tier (its base model under
its settings) and every checkpoint (the policy version saved at its step, under its run's tier
settings as they were at launch) of the caller's projects, and the LoRA adapters loaded at run time
(`adapter_load`, vLLM's `/v1/load_lora_adapter`: a run's policy version served on a tier's base
model under the name the caller chose). Everything through the caller's role.

Model ids: `tier-<id>`, `run-<run id>-step-<step>`, and each loaded adapter's name.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User

from core.artifacts import ArtifactMissingError, artifact_exists, artifact_get
from core.roles import Permission, role_allows
from inference.adapters import adapter_base, is_adapter
from inference.settings import model_source, tier_snapshot
from projects import selectors as project_selectors
from runs import selectors
from runs.models import Checkpoint, Run
from runs.run_store import policy_dir
from serving.models import ServedAdapter
from tiers import selectors as tier_selectors
from tiers.models import Tier

TIER_ID = re.compile(r"^tier-(\d{1,18})$")
CHECKPOINT_ID = re.compile(r"^run-(\d{1,18})-step-(\d{1,18})$")
MAX_CHECKPOINTS_LISTED = 200
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
POLICY_ARTIFACT = re.compile(r"^runs/(\d{1,18})-([0-9a-f-]{36})/policies/v(\d{1,18})$")


# Names that apps above serving serve (finetuning: a job's fine_tuned_model), each resolver
# (user=, model_id=, fetch=) -> ServedModel | None and each lister (user=) -> [ServedModel]. They
# register in their AppConfig.ready, so serving imports none of them.
MODEL_RESOLVERS: list[Callable[..., "ServedModel | None"]] = []
MODEL_LISTERS: list[Callable[..., list["ServedModel"]]] = []


# Turn keepers, registered by apps above serving (episodes: an external agent's episode): each
# (user=, model=, episode=, n=) -> a function that keeps the decoded turn (prompt text, Completion,
# the assistant message answered), or None when the episode is not its own; it raises OpenAIError
# when the episode cannot take a turn.
TURN_KEEPERS: list[Callable[..., Callable[..., None] | None]] = []


class UnknownModelError(LookupError):
    """No model by that id that the caller may use."""


class AdapterLoadError(ValueError):
    """An adapter cannot be loaded or unloaded: the message, the parameter at fault, a status."""

    def __init__(self, message: str, param: str | None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


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
    adapter: Path | None = None  # a loaded adapter's local folder (fetched), generated with on `source`
    root: str | None = None  # vLLM's card fields for an adapter: what was loaded, and onto which model
    parent: str | None = None
    policy_version: int | None = None  # a run's policy served as `run-<id>`: the version that answers

    def card(self) -> dict[str, Any]:
        """The model object of /v1/models, with Flywheel's own facts beside OpenAI's fields."""
        card = {
            "id": self.id,
            "object": "model",
            "created": self.created,
            "owned_by": self.project,
            "flywheel": {"name": self.name, "kind": self.kind, "project": self.project_id},
        }
        if self.kind == "adapter":
            card |= {"root": self.root, "parent": self.parent}
        return card


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


def adapter_model(adapter: ServedAdapter, *, fetch: bool = False) -> ServedModel:
    tier = adapter.tier
    return ServedModel(
        id=adapter.name,
        name=f"{adapter.run.name} adapter {adapter.artifact.rsplit('/', 1)[-1]} on {tier.name}",
        kind="adapter",
        project_id=tier.project_id,
        project=tier.project.name,
        created=int(adapter.created_at.timestamp()),
        source=model_source(tier.base_model),
        config=tier_snapshot(tier),
        adapter=artifact_get(adapter.artifact) if fetch else None,
        root=adapter.artifact,
        parent=f"tier-{tier.pk}",
    )


def served_models_for(*, user: User) -> list[ServedModel]:
    """The caller's tiers (by project, then name), the adapters loaded on them, then their newest
    checkpoints."""
    tiers = tier_selectors.tiers_for(user=user).order_by("project__name", "name", "pk")
    adapters = ServedAdapter.objects.filter(tier__in=tiers).select_related("tier__project", "run")
    checkpoints = (
        selectors.checkpoints_for(user=user)
        .select_related("run__project")
        .order_by("-created_at", "-pk")[:MAX_CHECKPOINTS_LISTED]
    )
    return (
        [tier_model(tier) for tier in tiers]
        + [adapter_model(adapter) for adapter in adapters]
        + [checkpoint_model(c) for c in checkpoints]
        + [model for lister in MODEL_LISTERS for model in lister(user=user)]
    )


def _can_view(user: User, project_id: int) -> bool:
    return role_allows(project_selectors.role_of(user=user, project_id=project_id), Permission.VIEW)


def adapter_load(*, user: User, name: Any, artifact: Any, base: Any = None) -> ServedAdapter:
    """Serve the run's policy version stored as `artifact` (an adapter) under `name` on the tier
    `base` (`tier-<id>`; by default the caller's one local tier on the adapter's base model). The
    same name for the same adapter again is harmless; a name taken by another is refused."""
    if not isinstance(name, str) or not ADAPTER_NAME.match(name):
        raise AdapterLoadError("lora_name must be 1-200 letters, digits, '.', '_', ':' or '-'", "lora_name")
    if not isinstance(artifact, str) or not (match := POLICY_ARTIFACT.match(artifact.strip("/"))):
        raise AdapterLoadError(
            "lora_path must name a policy version in Flywheel's artifact storage, runs/<run id>-<run "
            "key>/policies/v<N> (a tier's engine_adapter_root stays empty for a Flywheel engine)",
            "lora_path",
        )
    artifact = artifact.strip("/")
    run = Run.objects.filter(pk=int(match[1]), key=match[2]).select_related("project").first()
    if run is None or not _can_view(user, run.project_id) or not artifact_exists(artifact):
        raise AdapterLoadError(f"no policy version {artifact} that you may use", "lora_path", 404)
    folder = artifact_get(artifact)
    if not is_adapter(folder):
        raise AdapterLoadError(
            f"{artifact} holds full weights, not a LoRA adapter: only LoRA runs' versions load", "lora_path"
        )
    tier = _adapter_tier(user, base, adapter_base(folder))
    adapter, created = ServedAdapter.objects.get_or_create(
        name=name, defaults={"tier": tier, "run": run, "artifact": artifact, "loaded_by": user}
    )
    if not created and (adapter.tier_id, adapter.artifact) != (tier.pk, artifact):
        raise AdapterLoadError(f"The lora adapter '{name}' has already been loaded.", "lora_name")
    return adapter


def _adapter_tier(user: User, base: Any, trained_on: str) -> Tier:
    """The tier an adapter is served on: the one named, else the caller's only local tier whose
    base model the adapter was trained on."""
    if base is not None:
        match = TIER_ID.match(base) if isinstance(base, str) else None
        tier = Tier.objects.filter(pk=int(match[1])).first() if match else None
        if tier is None or not _can_view(user, tier.project_id):
            raise AdapterLoadError(
                f"base_model: no tier {base!r} that you may use (tier-<id>)", "base_model", 404
            )
    else:
        candidates = [
            t
            for t in tier_selectors.tiers_for(user=user).filter(base_model=trained_on)
            if t.engine == "local"
        ]
        if len(candidates) != 1:
            raise AdapterLoadError(
                f"base_model: name the tier to serve the adapter on (tier-<id>); {len(candidates)} of your "
                f"local tiers have its base model {trained_on}",
                "base_model",
            )
        tier = candidates[0]
    if tier.engine != "local":
        raise AdapterLoadError(
            f"base_model: tier-{tier.pk} decodes on an external engine; adapters load on local tiers",
            "base_model",
        )
    if tier.precision == "int8":
        raise AdapterLoadError(
            f"base_model: tier-{tier.pk} is int8 and cannot carry an adapter", "base_model"
        )
    return tier


def adapter_unload(*, user: User, name: Any) -> str:
    adapter = (
        ServedAdapter.objects.filter(name=name).select_related("tier").first()
        if isinstance(name, str)
        else None
    )
    if adapter is None or not _can_view(user, adapter.tier.project_id):
        raise AdapterLoadError(f"The lora adapter '{name}' cannot be found.", "lora_name", 404)
    adapter.delete()
    return adapter.name


def served_model_for(*, user: User, model_id: str, fetch: bool = False) -> ServedModel:
    """The model by id, if the caller's role lets them use it; UnknownModelError otherwise (a model of a
    project the caller is not in is reported as absent, as everywhere). `fetch`: a checkpoint's
    weights brought into this host's cache, to generate with."""
    for resolver in MODEL_RESOLVERS:
        try:
            if (found := resolver(user=user, model_id=model_id, fetch=fetch)) is not None:
                return found
        except ArtifactMissingError:
            raise UnknownModelError(
                f"The weights of `{model_id}` are no longer in the artifact storage."
            ) from None
    if match := TIER_ID.match(model_id):
        tier = Tier.objects.select_related("project").filter(pk=int(match[1])).first()
        if tier is not None and role_allows(
            project_selectors.role_of(user=user, project_id=tier.project_id), Permission.VIEW
        ):
            return tier_model(tier)
    elif match := CHECKPOINT_ID.match(model_id):
        checkpoint = (
            Checkpoint.objects.select_related("run__project")
            .filter(run_id=int(match[1]), step=int(match[2]))
            .first()
        )
        if checkpoint is not None and role_allows(
            project_selectors.role_of(user=user, project_id=checkpoint.run.project_id), Permission.VIEW
        ):
            try:
                return checkpoint_model(checkpoint, fetch=fetch)
            except ArtifactMissingError:
                raise UnknownModelError(
                    f"The weights of `{model_id}` are no longer in the artifact storage."
                ) from None
    else:
        adapter = ServedAdapter.objects.select_related("tier__project", "run").filter(name=model_id).first()
        if adapter is not None and _can_view(user, adapter.tier.project_id):
            try:
                return adapter_model(adapter, fetch=fetch)
            except ArtifactMissingError:
                raise UnknownModelError(
                    f"The adapter `{model_id}` is no longer in the artifact storage."
                ) from None
    raise UnknownModelError(f"The model `{model_id}` does not exist or you do not have access to it.")
