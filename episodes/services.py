"""Writes: handing out a run's episodes to external agents, recording their turns, taking their
outcomes, and storing each finished episode as the trajectory of its slot.

A run of `external_rollouts` has rollout batches like any online run (the learner creates them,
step by step), but no rollout worker plays them: each batch's slots (an item, and its index in the
item's group of `group_size`) are handed out to agents, group by group. A slot is held by one live
episode; an episode that does not report before its deadline is timed out (counted, shown, never
learned) and its slot handed out again; a batch is done when every slot holds a stored trajectory.
"""

import logging
import os
import socket
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from celery import current_app
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.exceptions import StateError
from core.roles import Permission
from costs.services import rollout_component, usage_record
from episodes.models import Episode
from inference.openai_protocol import OpenAIError
from inference.records import completion_record
from projects import selectors as project_selectors
from runs import selectors as run_selectors
from runs.lifecycle import run_event
from runs.models import RolloutBatch, Run, Trajectory, TrajectoryStep

if TYPE_CHECKING:  # the web process records turns without importing the decoder (torch)
    from inference.generation import Completion

logger = logging.getLogger(__name__)

MAX_TURNS = 256  # an episode's turns past this are refused: an agent stuck in a loop
SCORE_TASK = "workers.rollout.episode_score"
OPEN_BATCHES = (RolloutBatch.Status.PENDING, RolloutBatch.Status.RUNNING)


class NoEpisodeError(StateError):
    """Every slot of the run's open batches is being played: the learner makes more as it steps."""


def episode_start(*, run: Run, user: User) -> Episode:
    """Hand out the next free slot of the run's oldest open batch: a group's slots go out before
    the next group's, so groups complete (and are learned) in order."""
    if run.status != Run.Status.RUNNING:
        raise StateError(f"the run is {run.status}; episodes are handed out while it is running")
    episodes_expire(run=run)
    for _ in range(3):  # two agents asking at once may pick one slot; the constraint sends one back
        try:
            with transaction.atomic():
                locked = Run.objects.select_for_update().get(pk=run.pk)  # one hand-out at a time
                slot = _free_slot(locked)
                if slot is None:
                    raise NoEpisodeError(
                        "every episode of the run's open rollout batches is being played; "
                        "ask again when one ends or the learner steps"
                    )
                batch, item_id, sample_index = slot
                seconds = float(run.resolved.get("episode_deadline_seconds", 120.0))
                episode = Episode.objects.create(
                    run=run,
                    batch=batch,
                    item_id=item_id,
                    sample_index=sample_index,
                    policy_version=locked.policy_version,
                    deadline_at=timezone.now() + timedelta(seconds=seconds),
                    started_by=user,
                )
                RolloutBatch.objects.filter(pk=batch.pk, status=RolloutBatch.Status.PENDING).update(
                    status=RolloutBatch.Status.RUNNING, claimed_at=timezone.now(), worker="external"
                )
                return episode
        except IntegrityError:
            continue
    raise NoEpisodeError("the run's free episodes were all taken meanwhile; ask again")


def _free_slot(run: Run) -> tuple[RolloutBatch, int, int] | None:
    group_size = int(run.resolved["group_size"])
    batches = RolloutBatch.objects.filter(run=run, status__in=OPEN_BATCHES).order_by("step", "index")
    for batch in batches:
        held = set(
            Episode.objects.filter(batch=batch, status__in=Episode.LIVE).values_list(
                "item_id", "sample_index"
            )
        )
        for item_id in batch.item_ids:
            for sample_index in range(group_size):
                if (item_id, sample_index) not in held:
                    return batch, item_id, sample_index
    return None


def episode_turn_check(episode: Episode, *, n: int) -> None:
    """Before decoding a turn: the episode is open and the request samples one answer."""
    if n != 1:
        raise ValueError("an episode's turn samples one completion (n=1); start one episode per sample")
    _open_or_refuse(episode)
    if len(episode.turns) >= MAX_TURNS:
        raise StateError(f"the episode has {MAX_TURNS} turns, the most one may have; report its outcome")


def _open_or_refuse(episode: Episode) -> None:
    if episode.status == Episode.Status.OPEN and episode.deadline_at <= timezone.now():
        episodes_expire(run=episode.run)
        episode.refresh_from_db()
    if episode.status != Episode.Status.OPEN:
        reasons: dict[str, str] = {
            Episode.Status.TIMED_OUT: "timed out (its deadline passed; its slot went to another episode)",
            Episode.Status.CANCELLED: "cancelled (its rollout batch was cancelled)",
        }
        why = reasons.get(episode.status, f"already {episode.status}: an episode reports once")
        raise StateError(f"episode {episode.key} is {why}")


def episode_turn_record(
    *, episode: Episode, prompt: str, completion: "Completion", version: int, reply: dict
) -> None:
    """Keep a turn exactly as it was decoded: the prompt's and the completion's token ids (what the
    learner trains on, never the text re-tokenised) and the behaviour log-probs."""
    turn = completion_record(prompt, completion) | {
        "policy_version": version,
        "tool_calls": reply.get("tool_calls") or [],
    }
    with transaction.atomic():
        locked = Episode.objects.select_for_update().get(pk=episode.pk)
        if locked.status != Episode.Status.OPEN:
            logger.info("turn of %s not kept: the episode is %s", locked, locked.status)
            return
        locked.turns = [*locked.turns, turn]
        locked.save(update_fields=["turns"])


def episode_report(
    *,
    episode: Episode,
    reward: float | None = None,
    components: dict[str, float] | None = None,
    final: str | None = None,
) -> Episode:
    """End the episode with its reward (and per-component rewards), or with a final answer the
    run's reward rule scores on a rollout worker. A second report is refused: an episode is learned
    once."""
    with transaction.atomic():
        locked = Episode.objects.select_for_update().select_related("run", "batch").get(pk=episode.pk)
        _open_or_refuse(locked)
        if reward is None:
            locked.status, locked.final = Episode.Status.SCORING, final or ""
            locked.save(update_fields=["status", "final"])
            transaction.on_commit(lambda: _send_score(locked.pk))
            return locked
        episode_store(locked, reward=reward, components=components or {})
    return locked


def _send_score(episode_id: int) -> None:
    current_app.send_task(SCORE_TASK, args=[episode_id])


def episode_store(
    episode: Episode,
    *,
    reward: float | None,
    components: dict[str, Any],
    errors: list[dict] | None = None,
    flags: list[dict] | None = None,
) -> Trajectory:
    """The episode as the trajectory of its slot (one step per turn); its batch is done when every
    slot has one. An episode without turns has nothing to learn from: stored as errored."""
    turns = episode.turns
    errors = list(errors or [])
    if not turns:
        errors.append(
            {"kind": "no_turns", "message": "the agent reported before any turn on the run's model"}
        )
    errored = reward is None or not turns
    versions = [turn["policy_version"] for turn in turns] or [episode.policy_version]
    now = timezone.now()
    with transaction.atomic():
        trajectory = Trajectory.objects.create(
            run_id=episode.run_id,
            batch_id=episode.batch_id,
            item_id=episode.item_id,
            sample_index=episode.sample_index,
            policy_version=min(versions),
            outcome=Trajectory.Outcome.ERRORED if errored else Trajectory.Outcome.SCORED,
            reward=None if errored else reward,
            components=components,
            errors=errors,
            flags=flags or [],
            completion_text=turns[-1]["completion"] if turns else episode.final,
            prompt_tokens=sum(len(turn["prompt_token_ids"]) for turn in turns),
            completion_tokens=sum(len(turn["token_ids"]) for turn in turns),
            step_count=len(turns),
            wall_seconds=(now - episode.created_at).total_seconds(),
        )
        steps = []
        for index, turn in enumerate(turns):
            payload, size = TrajectoryStep.pack(turn)
            steps.append(
                TrajectoryStep(
                    trajectory=trajectory, index=index, kind="completion", payload=payload, raw_size=size
                )
            )
        TrajectoryStep.objects.bulk_create(steps)
        if RolloutBatch.objects.filter(pk=episode.batch_id, status=RolloutBatch.Status.CANCELLED).exists():
            Trajectory.objects.filter(pk=trajectory.pk).update(outcome=Trajectory.Outcome.CANCELLED)
        Episode.objects.filter(pk=episode.pk).update(
            status=Episode.Status.REPORTED, trajectory=trajectory, ended_at=now, reward=reward
        )
        episode.status, episode.trajectory, episode.ended_at = Episode.Status.REPORTED, trajectory, now
        episode.reward = reward
        _batch_close_if_full(episode.batch_id, int(episode.run.resolved["group_size"]))
    return trajectory


def _batch_close_if_full(batch_id: int, group_size: int) -> None:
    batch = RolloutBatch.objects.get(pk=batch_id)
    if Trajectory.objects.filter(batch_id=batch_id).count() >= len(batch.item_ids) * group_size:
        closed = RolloutBatch.objects.filter(pk=batch_id, status__in=OPEN_BATCHES).update(
            status=RolloutBatch.Status.DONE, finished_at=timezone.now()
        )
        if closed:
            episodes_usage_record(batch)


def episodes_usage_record(batch: RolloutBatch) -> None:
    """A closed batch's decoding on /v1, billed as a rollout worker bills its batch (the same
    component, at learner step batch.step + 1): every turn its episodes took, the reported and the
    timed-out alike (the device did that work), its prompt prefilled, its tokens sampled, and its
    share of the device time of the decode that served it."""
    turns = [
        turn
        for episode_turns in Episode.objects.filter(batch=batch).values_list("turns", flat=True)
        for turn in episode_turns
    ]
    usage_record(
        run_id=batch.run_id,
        step=batch.step + 1,
        component=rollout_component(batch.item_ids),
        kind="rollout",
        worker=f"{socket.gethostname()}:{os.getpid()}",  # the process that took the last outcome
        device_class=next((turn["device_class"] for turn in turns if turn.get("device_class")), ""),
        device_seconds=sum(float(turn.get("device_seconds", 0.0)) for turn in turns),
        tokens_prefilled=sum(len(turn["prompt_token_ids"]) for turn in turns),
        tokens_sampled=sum(len(turn["token_ids"]) for turn in turns),
    )


def episodes_expire(*, run: Run) -> int:
    """Time out the run's open episodes past their deadline: dropped (never learned with a made-up
    reward), counted in a run event, their slots handed out again."""
    now = timezone.now()
    late = Episode.objects.filter(run=run, status=Episode.Status.OPEN, deadline_at__lte=now)
    count = late.update(status=Episode.Status.TIMED_OUT, ended_at=now)
    if count:
        run_event(
            run,
            "episode_timeout",
            f"{count} external episode{'s' if count > 1 else ''} timed out without an outcome: dropped, "
            "their slots handed out again",
            level="warning",
            data={"timed_out": count},
        )
    return count


def episodes_cancel(*, batches) -> int:
    """Cancel the live episodes of cancelled batches (a resume's rollback, the run's end)."""
    return Episode.objects.filter(
        batch__in=batches, status__in=(Episode.Status.OPEN, Episode.Status.SCORING)
    ).update(status=Episode.Status.CANCELLED, ended_at=timezone.now())


def episode_scored(
    *, episode_id: int, reward: float | None, components: dict, errors: list[dict], flags: list[dict]
) -> None:
    """The rule's grade of an episode's final answer (from the scoring task); once."""
    with transaction.atomic():
        episode = Episode.objects.select_for_update().select_related("run").get(pk=episode_id)
        if episode.status != Episode.Status.SCORING:
            return  # scored already (a redelivered task), or cancelled meanwhile
        episode_store(episode, reward=reward, components=components, errors=errors, flags=flags)


def turn_keeper_for(*, user: User, model: Any, episode: str, n: int):
    """For /v1 (serving.served_models.TURN_KEEPERS): the function that keeps a turn of `episode`, when
    the request is to that episode's run (`run-<id>`) by a caller who may play it; None when the
    episode is not that run's. OpenAIError when it cannot take a turn now."""
    if model.kind != "policy":
        return None
    run_id = int(model.id.removeprefix("run-"))
    try:
        found = Episode.objects.select_related("run").get(key=episode, run_id=run_id)
    except (Episode.DoesNotExist, ValidationError):
        return None
    role = project_selectors.role_of(user=user, project_id=found.run.project_id)
    if not run_selectors.role_allows(role, Permission.EDIT):
        raise OpenAIError(
            403,
            "playing a run's episodes needs the launcher or owner role",
            "metadata.episode_id",
            "forbidden",
        )
    try:
        episode_turn_check(found, n=n)
    except StateError as exc:
        raise OpenAIError(409, str(exc), "metadata.episode_id", "episode_closed") from None
    except ValueError as exc:
        raise OpenAIError(400, str(exc), "n", "invalid_value") from None
    version = int(model.policy_version)

    def keep(*, prompt: str, completion: "Completion", reply: dict) -> None:
        episode_turn_record(episode=found, prompt=prompt, completion=completion, version=version, reply=reply)

    return keep
