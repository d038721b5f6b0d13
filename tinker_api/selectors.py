"""The Tinker API's reads: the caller's sessions, models, requests and saved weights, and the
models this server offers. A session belongs to its project: anyone who may view the project may
read it, only its editors may drive it (the views ask)."""

from django.contrib.auth.models import User
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from projects.models import Project
from projects.selectors import visible_project_ids
from runs.models import Run
from tiers.models import Tier
from tinker_api.models import TinkerModel, TinkerRequest, TinkerSampler, TinkerSession, TinkerWeights
from traces.models import Trace


def sessions_for(*, user: User) -> QuerySet[TinkerSession]:
    return TinkerSession.objects.filter(project_id__in=visible_project_ids(user=user)).select_related(
        "project"
    )


def session_for(*, user: User, key: str) -> TinkerSession | None:
    return sessions_for(user=user).filter(key=key).first()


def model_for(*, user: User, model_id: str) -> TinkerModel | None:
    return (
        TinkerModel.objects.filter(model_id=model_id, session__project_id__in=visible_project_ids(user=user))
        .select_related("session", "session__project", "run")
        .first()
    )


def sampler_for(*, user: User, key: str) -> TinkerSampler | None:
    return (
        TinkerSampler.objects.filter(key=key, session__project_id__in=visible_project_ids(user=user))
        .select_related("session", "session__project")
        .first()
    )


def request_for(*, user: User, key: str) -> TinkerRequest | None:
    return (
        TinkerRequest.objects.filter(key=key, session__project_id__in=visible_project_ids(user=user))
        .select_related("model__run", "session")
        .first()
    )


def _weights_named(path: str) -> QuerySet[TinkerWeights]:
    """Weights by their path, tinker://<model id>/<weights|sampler_weights>/<name> (none if malformed)."""
    parts = path.removeprefix("tinker://").split("/")
    if not path.startswith("tinker://") or len(parts) != 3:
        return TinkerWeights.objects.none()
    model_id, kind, name = parts
    return TinkerWeights.objects.filter(model__model_id=model_id, kind=kind, name=name)


def _live(weights: QuerySet[TinkerWeights]) -> QuerySet[TinkerWeights]:
    """Weights whose time to live has not run out (an expired name is forgotten)."""
    return weights.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))


def weights_at(*, user: User, path: str) -> TinkerWeights | None:
    """Saved weights by their path, in a project the caller can view, or published."""
    return (
        _live(_weights_named(path))
        .filter(Q(model__session__project_id__in=visible_project_ids(user=user)) | Q(public=True))
        .select_related("model", "model__run", "model__run__tier", "model__session")
        .first()
    )


def weights_by_path(*, path: str) -> TinkerWeights | None:
    """Weights by their path, for the learner that loads them (the view checked the caller)."""
    return _live(_weights_named(path)).select_related("model").first()


def models_for(*, user: User, owned: bool, project_id: str | None = None) -> QuerySet[TinkerModel]:
    """Models the caller can read (`owned`: of sessions they opened), newest first."""
    models = TinkerModel.objects.filter(session__project_id__in=visible_project_ids(user=user))
    if owned:
        models = models.filter(session__created_by_id=user.pk)
    if project_id:
        models = models.filter(session__project_id=int(project_id)) if project_id.isdigit() else models.none()
    return models.select_related("session", "session__created_by", "run").order_by("-created_at", "-pk")


def weights_for(*, user: User) -> QuerySet[TinkerWeights]:
    """Saved weights of the models of sessions the caller opened, newest first."""
    return (
        _live(TinkerWeights.objects.all())
        .filter(
            model__session__created_by_id=user.pk,
            model__session__project_id__in=visible_project_ids(user=user),
        )
        .select_related("model")
        .order_by("-created_at", "-pk")
    )


def weights_of(*, model: TinkerModel) -> QuerySet[TinkerWeights]:
    return _live(model.weights.select_related("model")).order_by("created_at", "pk")


def model_of_run(*, run: Run) -> TinkerModel | None:
    return TinkerModel.objects.filter(run=run).select_related("session").first()


def samples_recorded(*, run: Run) -> int:
    """The model's samples recorded as traces of its project (workers.tinker_sampling names them)."""
    return Trace.objects.filter(project_id=run.project_id, model=f"run-{run.pk}").count()


def request_counts(*, model: TinkerModel) -> dict[str, int]:
    """The model's requests by state, every state named (0 when none)."""
    counts = dict.fromkeys(TinkerRequest.Status.values, 0)
    for status, count in model.requests.values_list("status").annotate(count=Count("pk")).order_by():
        counts[status] = count
    return counts


def models_offered(*, project: Project) -> list[str]:
    """What a client may name as a base model: the project's tiers' base models and names."""
    names: list[str] = []
    for tier in Tier.objects.filter(project=project).order_by("pk"):
        for name in (tier.base_model, tier.name):
            if name not in names:
                names.append(name)
    return names
