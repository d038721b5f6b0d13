"""The Tinker API's writes: sessions, training models (each a run of method `tinker`), the requests
the learner and the rollout workers run, sampling sessions and named weights.

The web process only queues: a training request waits for its model's learner process
(workers/learners/tinker.py), a sample for a rollout worker (`workers.rollout.tinker_sample`).
Every refusal is a `TinkerApiError` naming the field; nothing is written when one is raised.
"""

import hashlib
import json
import re
from datetime import timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.roles import Permission
from projects import selectors as project_selectors
from projects.models import Project, TaskSet, TaskSetVersion
from rewards import services as reward_services
from rewards.models import RewardRule
from runs import lifecycle
from runs.models import Run
from tiers.models import Tier
from tinker_api import notify, selectors
from tinker_api.models import TinkerModel, TinkerRequest, TinkerSampler, TinkerSession, TinkerWeights

SAMPLE_TASK = "workers.rollout.tinker_sample"
PLACEHOLDER = "Tinker API"  # the task set and reward rule a Tinker run is filed under
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
# A Tinker model is a run that lasts as long as its session; its steps are the client's optim steps.
MAX_STEPS = 10**9
TERMINAL = set(Run.TERMINAL)


class TinkerApiError(Exception):
    """A request the API refuses: the status, what is wrong and where."""

    def __init__(self, status: int, message: str, *, field: str = "") -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.status = status
        self.field = field


# --- sessions --------------------------------------------------------------------------------


def session_create(*, user: User, project: Project, body: dict) -> TinkerSession:
    project_selectors.require(user=user, project_id=project.pk, permission=Permission.EDIT)
    tags = body.get("tags") or []
    metadata = body.get("user_metadata") or {}
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise TinkerApiError(400, "must be a list of strings", field="tags")
    if not isinstance(metadata, dict):
        raise TinkerApiError(400, "must be an object", field="user_metadata")
    return TinkerSession.objects.create(
        project=project,
        created_by_id=user.pk,
        display_name=str(body.get("display_name") or "")[:200],
        tags=tags[:50],
        user_metadata=metadata,
        sdk_version=str(body.get("sdk_version") or "")[:40],
    )


def session_heartbeat(*, session: TinkerSession) -> None:
    if session.status != TinkerSession.Status.ACTIVE:
        raise TinkerApiError(400, f"the session has {session.status}", field="session_id")
    TinkerSession.objects.filter(pk=session.pk).update(heartbeat_at=timezone.now())


def session_end(*, session: TinkerSession, status: str = TinkerSession.Status.FINISHED) -> None:
    """The client closed the session (or its heartbeats stopped): its models' learners end their
    runs when they next look (workers/learners/tinker.py), and queued work is refused."""
    with transaction.atomic():
        ended = TinkerSession.objects.filter(pk=session.pk, status=TinkerSession.Status.ACTIVE).update(
            status=status, ended_at=timezone.now()
        )
        if ended:
            TinkerRequest.objects.filter(session=session, status=TinkerRequest.Status.PENDING).update(
                status=TinkerRequest.Status.FAILED,
                error=f"the session {status} before this request ran",
                finished_at=timezone.now(),
            )
            queued = Run.objects.filter(
                tinker_model__session=session, status__in=(Run.Status.QUEUED, Run.Status.PAUSED)
            )
            for run in queued:
                lifecycle.run_cancel(run=run)


def sessions_expire(*, only: TinkerSession | None = None) -> int:
    """Sessions whose client stopped sending heartbeats are ended: every one (the scheduler's
    tick), or `only` (its model's learner, every second)."""
    stale = timezone.now() - timedelta(seconds=settings.FLYWHEEL_TINKER_SESSION_TIMEOUT)
    silent = TinkerSession.objects.filter(status=TinkerSession.Status.ACTIVE, heartbeat_at__lt=stale)
    expired = list(silent.filter(pk=only.pk) if only is not None else silent)
    for session in expired:
        session_end(session=session, status=TinkerSession.Status.EXPIRED)
    return len(expired)


# --- training models --------------------------------------------------------------------------


def _tier_for(project: Project, base_model: str) -> Tier:
    """The project's tier a client's base model names: by the tier's name or its base model."""
    tiers = Tier.objects.filter(project=project)
    found = (
        tiers.filter(name=base_model).first() or tiers.filter(base_model=base_model).order_by("pk").first()
    )
    if found is None:
        offered = sorted({tier.base_model for tier in tiers} | {tier.name for tier in tiers})
        raise TinkerApiError(
            400,
            f"no tier of project {project.name!r} has the base model {base_model!r}; "
            f"this server offers {', '.join(offered) or 'no model: add a tier first'}",
            field="base_model",
        )
    return found


def _placeholders(project: Project, by: User) -> tuple[TaskSetVersion, Any]:
    """The task set and reward rule a Tinker run is filed under: a Tinker client's loop sends its
    own data and rewards, so both are empty stand-ins, one per project, made on first use."""
    task_set = TaskSet.objects.filter(project=project, name=PLACEHOLDER).first()
    if task_set is None:
        try:
            with transaction.atomic():
                task_set = TaskSet.objects.create(
                    project=project,
                    name=PLACEHOLDER,
                    description="Runs of the Tinker API: each client's loop sends its own data",
                    created_by_id=by.pk,
                )
                TaskSetVersion.all_objects.create(
                    task_set=task_set,
                    number=1,
                    content_hash=hashlib.sha256(b"").hexdigest(),
                    item_count=0,
                    heldout_fraction=0.0,
                    source_name="Tinker API: no items (the data comes from the client's loop)",
                    created_by_id=by.pk,
                )
        except IntegrityError:  # another session made them first
            task_set = TaskSet.objects.get(project=project, name=PLACEHOLDER)
    rule = RewardRule.objects.filter(project=project, name=PLACEHOLDER).first()
    if rule is None:
        try:
            with transaction.atomic():
                rule = reward_services.reward_rule_create(
                    project=project,
                    name=PLACEHOLDER,
                    spec={
                        "type": "string_check",
                        "name": "none",
                        "input": "{{sample.output_text}}",
                        "reference": "",
                        "operation": "eq",
                    },
                    by=by,
                    description="Runs of the Tinker API: each client's loop computes its own rewards",
                )
        except ValidationError:
            rule = RewardRule.objects.get(project=project, name=PLACEHOLDER)
    version, rule_version = (
        task_set.versions.order_by("number").first(),
        rule.versions.order_by("number").first(),
    )
    assert version is not None and rule_version is not None  # made together with their parents
    return version, rule_version


def lora_spec(lora: dict) -> str:
    """Tinker's LoRA flags as Flywheel's `lora_target_modules` (inference/adapters.py)."""
    parts = [
        name
        for name, flag in (("attention", "train_attn"), ("mlp", "train_mlp"), ("unembed", "train_unembed"))
        if lora.get(flag, True)
    ]
    if not parts:
        raise TinkerApiError(400, "train at least one of attention, MLP or unembedding", field="lora_config")
    return ",".join(parts)


def _lora(body: dict) -> dict | None:
    lora = body.get("lora_config")
    if lora is None:
        return None
    rank = lora.get("rank")
    if not isinstance(rank, int) or not 1 <= rank <= 1024:
        raise TinkerApiError(400, "must be an integer from 1 to 1024", field="lora_config.rank")
    return {
        "rank": rank,
        "seed": lora.get("seed"),
        "train_attn": bool(lora.get("train_attn", True)),
        "train_mlp": bool(lora.get("train_mlp", True)),
        "train_unembed": bool(lora.get("train_unembed", True)),
    }


def _optimizer(body: dict) -> dict:
    optimizer = body.get("optimizer_config") or {"type": "adamw"}
    if not isinstance(optimizer, dict) or optimizer.get("type", "adamw") != "adamw":
        kind = optimizer.get("type") if isinstance(optimizer, dict) else optimizer
        raise TinkerApiError(
            400, f"{kind!r} is not served; this server trains with AdamW", field="optimizer_config"
        )
    return {"type": "adamw"}


@transaction.atomic
def model_create(
    *,
    session: TinkerSession,
    by: User,
    body: dict,
    idempotency_key: str = "",
    load: dict | None = None,
) -> TinkerRequest:
    """A training model: a run of method `tinker` (queued like any run of its project) and the
    request that completes once its learner has loaded it. With `load` (a create-via-load), the
    model starts from saved weights and the request completes once they are loaded."""
    if (again := _again(session, idempotency_key)) is not None:
        return again
    _active(session)
    seq_id = body.get("model_seq_id")
    if not isinstance(seq_id, int) or seq_id < 0:
        raise TinkerApiError(400, "must be a non-negative integer", field="model_seq_id")
    model_id = f"{session.key}:train:{seq_id}"
    if TinkerModel.objects.filter(model_id=model_id).exists():
        raise TinkerApiError(400, f"model {model_id} exists already", field="model_seq_id")
    source = load["weights"] if load else None
    base_model = str(body.get("base_model") or (source.model.base_model if source else ""))
    if not base_model:
        raise TinkerApiError(400, "is required", field="base_model")
    tier = (
        source.model.run.tier
        if source and not body.get("base_model")
        else _tier_for(session.project, base_model)
    )
    lora = source.model.lora if source else _lora(body)
    hyperparameters: dict[str, Any] = {"adapter": "none"}
    if lora is not None:
        hyperparameters = {
            "adapter": "lora",
            "lora_rank": lora["rank"],
            "lora_alpha": float(settings.FLYWHEEL_TINKER_LORA_ALPHA),
            "lora_target_modules": lora_spec(lora),
        }
        if lora.get("seed") is not None:
            hyperparameters["seed"] = int(lora["seed"]) % 2**31
    version, rule = _placeholders(session.project, by)
    name = session.display_name or f"tinker {session.key[:8]}"
    request = lifecycle.RunRequest(
        project=session.project,
        name=f"{name} · model {seq_id}"[:100],
        task_set_version=version,
        reward_rule_version=rule,
        tier=tier,
        method="tinker",
        hyperparameters=hyperparameters,
        max_steps=MAX_STEPS,
    )
    try:
        run = lifecycle.run_create(request=request, by=by)
    except ValidationError as exc:
        problems = "; ".join(f"{field}: {' '.join(m)}" for field, m in exc.message_dict.items())
        raise TinkerApiError(400, f"the model cannot be made: {problems}", field="base_model") from None
    model = TinkerModel.objects.create(
        model_id=model_id,
        session=session,
        seq_id=seq_id,
        run=run,
        base_model=base_model,
        lora=lora,
        optimizer=_optimizer(body),
        load_path=source.path if source else "",
        load_optimizer=bool(load and load["optimizer"]),
    )
    kind = TinkerRequest.Kind.LOAD_WEIGHTS if load else TinkerRequest.Kind.CREATE_MODEL
    return TinkerRequest.objects.create(
        session=session,
        model=model,
        kind=kind,
        idempotency_key=idempotency_key,
        body=json.dumps(body).encode(),
    )


def _again(session: TinkerSession, idempotency_key: str) -> TinkerRequest | None:
    """The request a retried POST (the same `X-Idempotency-Key`) made the first time."""
    if not idempotency_key:
        return None
    return TinkerRequest.objects.filter(session=session, idempotency_key=idempotency_key).first()


def _active(session: TinkerSession) -> None:
    if session.status != TinkerSession.Status.ACTIVE:
        raise TinkerApiError(400, f"the session has {session.status}; start a new one", field="session_id")


def request_submit(*, model: TinkerModel, kind: str, body: bytes, idempotency_key: str = "") -> TinkerRequest:
    """Queue work for a model's learner; its run must not have ended."""
    if (again := _again(model.session, idempotency_key)) is not None:
        return again
    _active(model.session)
    status = Run.objects.filter(pk=model.run_id).values_list("status", flat=True).get()
    if status in TERMINAL:
        raise TinkerApiError(400, f"the model's run ({model.run_id}) is {status}", field="model_id")
    try:
        with transaction.atomic():
            request = TinkerRequest.objects.create(
                session=model.session, model=model, kind=kind, idempotency_key=idempotency_key, body=body
            )
            transaction.on_commit(lambda: notify.work_queued(model.pk))  # its learner wakes
            return request
    except IntegrityError:  # the same key, raced by a concurrent retry
        found = _again(model.session, idempotency_key)
        if found is None:
            raise
        return found


# --- sampling ---------------------------------------------------------------------------------


def weights_for(*, user: User, path: str, kind: str, field: str) -> TinkerWeights:
    """Saved weights by their tinker:// path, in a project the caller can view."""
    found = selectors.weights_at(user=user, path=path)
    if found is None:
        raise TinkerApiError(404, f"no saved weights at {path!r} that you can read", field=field)
    if found.kind != kind:
        wanted = (
            "sampler weights (save_weights_for_sampler)"
            if kind == TinkerWeights.Kind.SAMPLER
            else ("training weights (save_weights / save_state)")
        )
        raise TinkerApiError(
            400, f"{path} holds {found.get_kind_display()}; this needs {wanted}", field=field
        )
    return found


def sampler_create(*, session: TinkerSession, user: User, body: dict) -> TinkerSampler:
    _active(session)
    path = body.get("model_path")
    seq_id = body.get("sampling_session_seq_id") or 0
    if path:
        weights = weights_for(user=user, path=str(path), kind=TinkerWeights.Kind.SAMPLER, field="model_path")
        run = weights.model.run
        return TinkerSampler.objects.create(
            session=session,
            seq_id=seq_id,
            tier=run.tier,
            run=run,
            policy_version=weights.step,
            base_model=weights.model.base_model,
            model_path=str(path),
        )
    base_model = body.get("base_model")
    if not base_model:
        raise TinkerApiError(400, "name a base_model or a model_path", field="base_model")
    tier = _tier_for(session.project, str(base_model))
    return TinkerSampler.objects.create(session=session, seq_id=seq_id, tier=tier, base_model=str(base_model))


def sampler_of_version(*, model: TinkerModel, version: int, seq_id: int) -> TinkerSampler:
    """A sampling session on a model's policy version (the learner's, for unnamed sampler weights)."""
    return TinkerSampler.objects.create(
        session=model.session,
        seq_id=seq_id,
        tier=model.run.tier,
        run=model.run,
        policy_version=version,
        base_model=model.base_model,
        model_path=f"tinker://{model.model_id}/sampler_weights/step-{version}",
    )


def sample_submit(*, sampler: TinkerSampler, body: bytes, idempotency_key: str = "") -> TinkerRequest:
    """Queue a sample for the rollout workers (sent after the request is committed)."""
    if (again := _again(sampler.session, idempotency_key)) is not None:
        return again
    _active(sampler.session)
    with transaction.atomic():
        request = TinkerRequest.objects.create(
            session=sampler.session,
            sampler=sampler,
            kind=TinkerRequest.Kind.SAMPLE,
            idempotency_key=idempotency_key,
            body=body,
        )
        transaction.on_commit(lambda: current_app.send_task(SAMPLE_TASK, args=[request.pk]))
    return request


# --- the workers' side ------------------------------------------------------------------------


def request_take(*, model: TinkerModel) -> TinkerRequest | None:
    """The model's oldest pending request, now running (the learner runs them in order)."""
    with transaction.atomic():
        request = (
            TinkerRequest.objects.select_for_update()
            .filter(model=model, status=TinkerRequest.Status.PENDING)
            .order_by("pk")
            .first()
        )
        if request is None:
            return None
        request.status = TinkerRequest.Status.RUNNING
        request.started_at = timezone.now()
        request.save(update_fields=["status", "started_at"])
        return request


def samples_take(*, request_id: int, limit: int) -> list[TinkerRequest]:
    """The sample request to run and, when it could be taken, up to `limit - 1` more pending ones
    of the same sampling session (oldest first) to decode with it as one batch; empty when another
    worker has it or it was ended. Each is taken by its own conditional update, so two workers
    never take the same request."""
    pending = TinkerRequest.objects.filter(
        kind=TinkerRequest.Kind.SAMPLE, status=TinkerRequest.Status.PENDING
    )
    if not pending.filter(pk=request_id).update(
        status=TinkerRequest.Status.RUNNING, started_at=timezone.now()
    ):
        return []
    first = TinkerRequest.objects.select_related("sampler", "sampler__run").get(pk=request_id)
    others = (
        pending.filter(sampler_id=first.sampler_id).order_by("pk").values_list("pk", flat=True)[: limit - 1]
    )
    taken = [
        pk
        for pk in others
        if pending.filter(pk=pk).update(status=TinkerRequest.Status.RUNNING, started_at=timezone.now())
    ]
    return [first, *TinkerRequest.objects.filter(pk__in=taken).order_by("pk")]


def request_cancel(*, request: TinkerRequest) -> bool:
    """Cancel a sample no worker has taken yet; False when it had started or ended."""
    cancelled = TinkerRequest.objects.filter(
        pk=request.pk, kind=TinkerRequest.Kind.SAMPLE, status=TinkerRequest.Status.PENDING
    ).update(status=TinkerRequest.Status.FAILED, error="cancelled by the client", finished_at=timezone.now())
    if cancelled:
        _finished(request)
    return bool(cancelled)


def request_done(*, request: TinkerRequest, result: bytes, proto: bool = False) -> None:
    TinkerRequest.objects.filter(pk=request.pk).update(
        status=TinkerRequest.Status.DONE, result=result, result_proto=proto, finished_at=timezone.now()
    )
    _finished(request)


def _finished(request: TinkerRequest) -> None:
    """Wake the poll holding this request's future (once what it will read is committed)."""
    transaction.on_commit(lambda: notify.request_finished(request.key))


def request_failed(*, request: TinkerRequest, error: str, user_error: bool = True) -> None:
    TinkerRequest.objects.filter(pk=request.pk).update(
        status=TinkerRequest.Status.FAILED,
        error=error[:5000],
        user_error=user_error,
        finished_at=timezone.now(),
    )
    _finished(request)


def requests_interrupted(*, model: TinkerModel, step: int) -> int:
    """Fail the requests a learner that died was running (its restart resumes at `step`)."""
    return TinkerRequest.objects.filter(model=model, status=TinkerRequest.Status.RUNNING).update(
        status=TinkerRequest.Status.FAILED,
        error=f"the model's learner restarted from its checkpoint at step {step} while this ran: "
        "the steps since that checkpoint are lost; load your last saved state and go on",
        user_error=False,
        finished_at=timezone.now(),
    )


def requests_refuse(*, model: TinkerModel, why: str) -> int:
    """Fail what the model's learner will not run (its run was cancelled or ended)."""
    return TinkerRequest.objects.filter(
        model=model, status__in=(TinkerRequest.Status.PENDING, TinkerRequest.Status.RUNNING)
    ).update(status=TinkerRequest.Status.FAILED, error=why, finished_at=timezone.now())


def weights_record(
    *, model: TinkerModel, kind: str, name: str, step: int, ttl_seconds: int | None
) -> TinkerWeights:
    expires = timezone.now() + timedelta(seconds=ttl_seconds) if ttl_seconds else None
    weights, _ = TinkerWeights.objects.update_or_create(
        model=model, kind=kind, name=name, defaults={"step": step, "expires_at": expires}
    )
    return weights


def _weights_named(model: TinkerModel, kind: str, name: str) -> TinkerWeights:
    weights = selectors.weights_of(model=model).filter(kind=kind, name=name).first()
    if weights is None:
        raise TinkerApiError(404, f"no weights named {name!r} ({kind}) of model {model.model_id}")
    return weights


def weights_publish(*, model: TinkerModel, kind: str, name: str, by: User, public: bool) -> None:
    """Publish saved weights to every user of this server (sample them, train from them), or stop.
    Only who opened the model's session may: it is their training run."""
    weights = _weights_named(model, kind, name)
    if model.session.created_by_id != by.pk:
        raise TinkerApiError(
            403, "only the training run's owner (who opened its session) may publish its weights"
        )
    TinkerWeights.objects.filter(pk=weights.pk).update(public=public)


def weights_ttl(*, model: TinkerModel, kind: str, name: str, ttl_seconds: Any) -> None:
    """Forget the name after `ttl_seconds` from now (None: keep it)."""
    weights = _weights_named(model, kind, name)
    whole = isinstance(ttl_seconds, int) and not isinstance(ttl_seconds, bool)
    if ttl_seconds is not None and not (whole and ttl_seconds >= 1):
        raise TinkerApiError(
            400, "ttl_seconds must be a whole number of seconds, 1 or more, or null", field="ttl_seconds"
        )
    expires = None if ttl_seconds is None else timezone.now() + timedelta(seconds=ttl_seconds)
    TinkerWeights.objects.filter(pk=weights.pk).update(expires_at=expires)


def weights_forget(*, model: TinkerModel, kind: str, name: str) -> None:
    deleted, _ = TinkerWeights.objects.filter(model=model, kind=kind, name=name).delete()
    if not deleted:
        raise TinkerApiError(404, f"no weights named {name!r} ({kind}) of model {model.model_id}")


def name_check(name: str, field: str = "path") -> str:
    if not NAME.match(name):
        raise TinkerApiError(
            400, f"{name!r}: a name of letters, digits, '.', '_' and '-' (at most 200)", field=field
        )
    return name
