"""A Tinker API training model as a run's learner: the model stays resident in this process and
runs its client's requests (tinker_api/) one after the other, in the order they came.

`forward_backward` adds the gradients of the named loss (Tinker's definitions: a sum over tokens,
never a mean) to what earlier calls left; `optim_step` applies them with the AdamW settings the
client sends and counts a step: the run's step, its metrics (loss, tokens) and its costs (a load
of saved weights is a step too: the run's steps only go forward).
`save_weights_for_sampler` publishes the weights as the run's policy version at that step (what
/v1 serves as run-<id>, what sampling sessions decode); `save_weights` is a run checkpoint, with the
optimiser, that `load_weights` (or a new model made from it) restores.

The run's controls hold: a pause (by hand, or at a money or device-hours budget) checkpoints the
model and ends this process (its requests wait, and go on in a new learner after a resume), a
cancel refuses what is queued, a crash restarts the learner from the run's last checkpoint. When
the client's session ends (closed, or its heartbeats stopped) or a wall-time budget runs out, the
run succeeds and what is queued is refused.
"""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from django.db.models import F
from django.utils import timezone

from core.exceptions import StateError
from costs import services as costs
from runs.lifecycle import run_event, run_transition
from runs.models import Checkpoint, Run
from runs.run_store import checkpoint_fetch, checkpoint_prefix
from runs.services import metrics_write
from tinker_api import notify, wire
from tinker_api import selectors as tinker_selectors
from tinker_api import services as tinker_services
from tinker_api.models import TinkerModel, TinkerRequest, TinkerSession, TinkerWeights
from workers.learners.common import (
    Learner,
    LearnerConfig,
    Log,
    budget_groups,
    learner_create,
    length_parts,
)
from workers.run_learner import (
    StopRequestedError,
    budget_spent,
    checkpoint,
    common_settings,
    cost_metrics_write,
    learner_usage_record,
    mark_running,
    publish,
    resume,
    status_check,
)

S = Run.Status
# The longest wait between looks for work when no wake-up comes (tinker_api.notify wakes the learner
# as work is queued): 2 ms after work, doubling to 10 ms while the client is busy, to 500 ms once
# it has been quiet a second.
IDLE_SLEEP = (0.002, 0.01, 0.5)
QUIET_SECONDS = 1.0
STATUS_EVERY = 1.0  # seconds between looks at the run's status and the session's heartbeat
CLIP_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
DRO_BETA = 0.05


class RequestError(ValueError):
    """The request cannot be run as sent: its answer says why (the client's error, not ours)."""


@dataclass
class Served:
    """The resident model and what its open step has gathered since the last optim_step."""

    run: Run
    row: TinkerModel
    learner: Learner
    config: LearnerConfig
    loss: float = 0.0
    tokens: int = 0
    weight: float = 0.0
    seconds: float = 0.0
    passes: dict[str, int] = field(default_factory=dict)
    pause_waits: bool = False  # a pause waits for the open step's optim_step

    @property
    def step_open(self) -> bool:
        """Gradients were gathered since the last optim_step (a checkpoint would not hold them)."""
        return bool(self.passes)

    @property
    def step(self) -> int:
        return self.learner.state.step


def serve(run_id: int, log: Log = print) -> None:
    run = Run.objects.get(pk=run_id)
    row = TinkerModel.objects.select_related("session").get(run=run)
    config = LearnerConfig(**common_settings(run) | {"lr_scheduler": "constant", "max_grad_norm": 0.0})
    learner, _ = learner_create(config)
    learner.model.train()
    step = resume(run, learner, config)
    served = Served(run=run, row=row, learner=learner, config=config)
    run = served.run = mark_running(run)
    if interrupted := tinker_services.requests_interrupted(model=row, step=step):
        # A learner that died mid-request: what it was running is lost, and with it whatever the
        # model did since the checkpoint it resumed from; the client is told, not left waiting.
        run_event(run, "restart", f"{interrupted} Tinker request(s) lost; the model resumed at step {step}")
    log(f"run {run.pk}: tinker model {row.model_id} resident at step {step}")
    _created(served)
    looked, idle, worked = 0.0, IDLE_SLEEP[0], time.monotonic()
    while True:
        if time.monotonic() - looked >= STATUS_EVERY:
            looked = time.monotonic()
            if _ended(served):
                return
        request = tinker_services.request_take(model=row)
        if request is None:
            notify.work_wait(row.pk, idle)  # woken as soon as the client queues work
            busy = time.monotonic() - worked < QUIET_SECONDS
            idle = min(idle * 2, IDLE_SLEEP[1] if busy else IDLE_SLEEP[2])
            continue
        _run_request(served, request, log)
        idle, worked = IDLE_SLEEP[0], time.monotonic()
        if served.pause_waits and not served.step_open:
            looked = 0.0  # the open step closed: pause now, before the next one opens


def _ended(served: Served) -> bool:
    """Whether this learner is done, having ended the run as it should: paused or cancelled, its
    session over, or a budget reached."""
    run = served.run
    try:
        status_check(run)
    except StopRequestedError as stop:
        if str(stop) == S.PAUSING and _pause_deferred(served):
            return False
        _stop(served, str(stop))
        return True
    if (ended := _session_ended(served.row.session)) is not None:
        _finish(served, f"the Tinker session {ended} after {served.step} steps", f"the session {ended}")
        return True
    if (spent := budget_spent(run)) is not None:
        _finish(served, f"succeeded: stopped, {spent}", f"the run stopped: {spent}")
        return True
    if served.step > 0 and costs.run_budget_check(run=run, step=served.step) is not None:
        if _pause_deferred(served):
            return False
        _stop(served, S.PAUSING)  # its requests wait for a resume, as for any pause
        return True
    return False


def _pause_deferred(served: Served) -> bool:
    """Whether a pause must wait: a checkpoint holds weights and optimiser, not the gradients of
    an open step, so the model pauses at the step's end (its optim_step) and loses nothing. The
    run says so once; a session that ends meanwhile ends the run as usual."""
    if not served.step_open:
        served.pause_waits = False
        return False
    if not served.pause_waits:
        served.pause_waits = True
        passes = sum(served.passes.values())
        run_event(
            served.run,
            "pause",
            f"the pause waits for the open step's optim_step ({passes} forward_backward pass(es) "
            f"gathered since step {served.step}): a checkpoint would not hold their gradients",
        )
    return True


def _created(served: Served) -> None:
    """Answer the model's creation (or its create-via-load, once the weights are in)."""
    first = served.row.requests.filter(status=TinkerRequest.Status.PENDING).order_by("pk").first()
    if first is not None and first.kind == TinkerRequest.Kind.CREATE_MODEL:
        tinker_services.request_done(
            request=first,
            result=json.dumps({"model_id": served.row.model_id, "type": "create_model"}).encode(),
        )


def _session_ended(session: TinkerSession) -> str | None:
    tinker_services.sessions_expire(only=session)
    status = TinkerSession.objects.filter(pk=session.pk).values_list("status", flat=True).get()
    return None if status == TinkerSession.Status.ACTIVE else status


def _run_request(served: Served, request: TinkerRequest, log: Log) -> None:
    started = time.monotonic()
    try:
        if request.kind in (TinkerRequest.Kind.FORWARD_BACKWARD, TinkerRequest.Kind.FORWARD):
            result, proto = forward_backward(served, wire.forward_backward_read(bytes(request.body))), True
        else:
            body = json.loads(bytes(request.body))
            result, proto = json.dumps(_JSON_REQUESTS[request.kind](served, body)).encode(), False
    except (RequestError, wire.WireError) as exc:
        tinker_services.request_failed(request=request, error=str(exc))
        return
    except Exception as exc:  # noqa: BLE001  (the learner goes on; the client reads why)
        log(f"run {served.run.pk}: {request.kind} {request.key} failed: {exc!r}")
        tinker_services.request_failed(
            request=request, error=f"{type(exc).__name__}: {exc}", user_error=False
        )
        return
    served.seconds += time.monotonic() - started
    tinker_services.request_done(request=request, result=result, proto=proto)


# --- forward and backward ---------------------------------------------------------------------


def forward_backward(served: Served, request: wire.ForwardBackward) -> bytes:
    """The loss's value and gradients over every datum (gradients added to the open step's unless
    forward-only), answered with each datum's target log-probs and per-token losses."""
    learner = served.learner
    model, device = learner.model, learner.accelerator.device
    lengths = [len(datum.tokens) for datum in request.data]
    parts = (
        budget_groups(lengths, served.config.micro_batch_tokens)
        if served.config.micro_batch_tokens
        else (length_parts(lengths))
    )
    logprobs: list[list[float]] = [[] for _ in request.data]
    losses: list[list[float]] = [[] for _ in request.data]
    total = 0.0
    for part in parts:
        width = max(lengths[row] for row in part)
        tokens = torch.zeros((len(part), width), dtype=torch.long)
        mask = torch.zeros((len(part), width), dtype=torch.bool)
        inputs = {name: torch.zeros((len(part), width)) for name in request.data[part[0]].inputs}
        for at, row in enumerate(part):
            datum = request.data[row]
            size = len(datum.tokens)
            tokens[at, :size] = torch.tensor(datum.tokens)
            mask[at, :size] = True
            for name, values in datum.inputs.items():
                if name in inputs:
                    inputs[name][at, :size] = torch.tensor(values)
        tokens, mask = tokens.to(device), mask.to(device)
        inputs = {name: value.to(device) for name, value in inputs.items()}
        with torch.set_grad_enabled(not request.forward_only), learner.accelerator.autocast():
            logits = model(input_ids=tokens, attention_mask=mask.long()).logits.float()
            target = inputs["target_tokens"].long().clamp(min=0, max=logits.size(-1) - 1)
            current = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
            per_token = token_losses(request.loss_fn, current, inputs, request.config) * mask
            loss = per_token.sum()
        if not request.forward_only:
            learner.accelerator.backward(loss)
        total += float(loss.detach())
        for at, row in enumerate(part):
            size = lengths[row]
            logprobs[row] = current[at, :size].detach().float().cpu().tolist()
            losses[row] = per_token[at, :size].detach().float().cpu().tolist()
    if not request.forward_only:
        served.loss += total
        served.tokens += sum(lengths)
        served.weight += sum(sum(datum.inputs.get("weights", [])) for datum in request.data)
        served.passes[request.loss_fn] = served.passes.get(request.loss_fn, 0) + 1
    metrics = {"loss:sum": total}
    return wire.forward_backward_write(
        {"logprobs": logprobs, "elementwise_loss": losses}, metrics, len(request.data)
    )


def token_losses(
    loss_fn: str, current: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict
) -> torch.Tensor:
    """Each token's loss under Tinker's definition of `loss_fn` (the total is their sum). RL losses
    weigh each token by `weights` when the datum sends them (a mask), by 1 otherwise."""
    if loss_fn == "cross_entropy":
        return -inputs["weights"] * current
    advantages, sampled = inputs["advantages"], inputs["logprobs"]
    ratio = torch.exp(current - sampled)
    low, high = (float(config.get(name, default)) for name, default in CLIP_DEFAULTS.items())
    if loss_fn == "importance_sampling":
        losses = -ratio * advantages
    elif loss_fn == "ppo":
        losses = -torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)
    elif loss_fn == "cispo":
        losses = -ratio.clamp(low, high).detach() * current * advantages
    elif loss_fn == "dro":
        beta = float(config.get("beta", DRO_BETA))
        losses = -(current * advantages - 0.5 * beta * (current - sampled) ** 2)
    else:
        raise RequestError(f"loss_fn: {loss_fn!r} is not served")
    return losses * inputs["weights"] if "weights" in inputs else losses


# --- the step, saves and loads ----------------------------------------------------------------


def optim_step(served: Served, body: dict) -> dict:
    """Apply the gathered gradients with the client's AdamW settings; the run's step advances."""
    params = body["adam_params"]
    learner = served.learner
    for group in learner.optimizer.param_groups:
        group["lr"] = float(params.get("learning_rate", 1e-4))
        group["betas"] = (float(params.get("beta1", 0.9)), float(params.get("beta2", 0.95)))
        group["eps"] = float(params.get("eps", 1e-12))
        group["weight_decay"] = float(params.get("weight_decay", 0.0))
    trained = [p for p in learner.model.parameters() if p.requires_grad]
    norm = torch.nn.utils.clip_grad_norm_(trained, float(params.get("grad_clip_norm") or 0.0) or float("inf"))
    learner.optimizer.step()
    learner.optimizer.zero_grad(set_to_none=True)
    learner.state.step += 1
    step = served.step
    TinkerModel.objects.filter(pk=served.row.pk).update(optim_steps=F("optim_steps") + 1)
    Run.objects.filter(pk=served.run.pk).update(learner_step=step, heartbeat_at=timezone.now())
    values = {
        "learner/loss_sum": served.loss,
        "learner/tokens": float(served.tokens),
        "learner/grad_norm": float(norm),
        "learner/learning_rate": float(params.get("learning_rate", 1e-4)),
        "time/learn": served.seconds,
    }
    if served.weight > 0:  # a supervised step: the mean negative log-likelihood of its weighted tokens
        values["learner/loss"] = served.loss / served.weight
    metrics_write(served.run, step, values)
    learner_usage_record(served.run, step, learner, [], [], served.seconds)
    cost_metrics_write(served.run, step)
    served.loss, served.tokens, served.weight, served.seconds = 0.0, 0, 0.0, 0.0
    served.passes.clear()
    return {"metrics": {"grad_norm": float(norm)}}


def _name(body: dict, served: Served, kind: str) -> str:
    name = body.get("path")
    if name is None:
        taken = served.row.weights.filter(kind=kind).count()
        return f"step-{served.step:06d}-{taken}"
    return tinker_services.name_check(str(name))


def save_weights(served: Served, body: dict) -> dict:
    """A run checkpoint (weights, optimiser and step) under the client's name."""
    name = _name(body, served, TinkerWeights.Kind.STATE)
    if (
        not body.get("overwrite")
        and served.row.weights.filter(kind=TinkerWeights.Kind.STATE, name=name).exists()
    ):
        raise RequestError(f"path: weights named {name!r} exist already (send overwrite to replace them)")
    Checkpoint.objects.filter(run=served.run, step=served.step).delete()  # the weights as they are now
    # run_learner.checkpoint annotates a GRPOConfig but reads only LearnerConfig's fields (to widen there).
    checkpoint(served.run, served.learner, served.config, served.step)  # type: ignore[arg-type]
    saved = tinker_services.weights_record(
        model=served.row,
        kind=TinkerWeights.Kind.STATE,
        name=name,
        step=served.step,
        ttl_seconds=body.get("ttl_seconds"),
    )
    return {"path": saved.path, "type": "save_weights"}


def save_weights_for_sampler(served: Served, body: dict) -> dict:
    """The weights as the run's policy version at this step: sampled by sampling sessions, served
    on /v1 as run-<id>, exported like any run's."""
    publish(served.run, served.step, served.learner)
    if body.get("path") is None and body.get("sampling_session_seq_id") is not None:
        # save_weights_and_get_sampling_client: unnamed weights, straight into a sampling session
        sampler = tinker_services.sampler_of_version(
            model=served.row, version=served.step, seq_id=int(body["sampling_session_seq_id"])
        )
        return {"sampling_session_id": sampler.key, "type": "save_weights_for_sampler"}
    name = _name(body, served, TinkerWeights.Kind.SAMPLER)
    saved = tinker_services.weights_record(
        model=served.row,
        kind=TinkerWeights.Kind.SAMPLER,
        name=name,
        step=served.step,
        ttl_seconds=body.get("ttl_seconds"),
    )
    run_event(
        served.run, "checkpoint", f"sampler weights {name} at step {served.step}", data={"step": served.step}
    )
    return {"path": saved.path, "type": "save_weights_for_sampler"}


def load_weights(served: Served, body: dict) -> dict:
    """Restore saved training weights (and the optimiser's state when asked) into this model."""
    source = tinker_selectors.weights_by_path(path=body["path"])
    if source is None or source.kind != TinkerWeights.Kind.STATE:
        raise RequestError(f"path: no saved training weights at {body['path']}")
    if not Checkpoint.objects.filter(run=source.model.run_id, step=source.step).exists():
        raise RequestError(f"path: the checkpoint behind {body['path']} is gone")
    target = Path(served.config.output_dir) / f"loaded-{source.model.run_id}-{source.step}"
    checkpoint_fetch(checkpoint_prefix(source.model.run_id, source.step), target)
    step = served.step
    try:
        served.learner.accelerator.load_state(str(target))
    except (RuntimeError, KeyError, ValueError) as exc:
        raise RequestError(f"path: {body['path']} does not fit this model ({exc})") from None
    if not body.get("optimizer"):
        served.learner.optimizer.state.clear()
    served.learner.optimizer.zero_grad(set_to_none=True)
    # A load changes the weights, so it is a step of the run: its steps (and the policy versions
    # named by them) only go forward, and a version once published never changes.
    served.learner.state.step = step + 1
    Run.objects.filter(pk=served.run.pk).update(learner_step=served.step, heartbeat_at=timezone.now())
    run_event(
        served.run, "checkpoint", f"loaded {body['path']} as step {served.step}", data={"step": served.step}
    )
    return {"path": body["path"], "model_id": served.row.model_id, "type": "load_weights"}


_JSON_REQUESTS: dict[str, Callable[[Served, dict], dict]] = {
    TinkerRequest.Kind.OPTIM_STEP: optim_step,
    TinkerRequest.Kind.SAVE_WEIGHTS: save_weights,
    TinkerRequest.Kind.SAVE_WEIGHTS_FOR_SAMPLER: save_weights_for_sampler,
    TinkerRequest.Kind.LOAD_WEIGHTS: load_weights,
}


# --- the end ----------------------------------------------------------------------------------


def _stop(served: Served, why: str) -> None:
    """A pause checkpoints the model (its requests wait for the resumed learner); a cancel refuses
    what is queued."""
    run = served.run
    if why == S.PAUSING:
        # run_learner.checkpoint annotates a GRPOConfig but reads only LearnerConfig's (to widen there).
        checkpoint(run, served.learner, served.config, served.step)  # type: ignore[arg-type]
        run_transition(run, allowed=(S.PAUSING,), to=S.PAUSED, message=f"paused at step {served.step}")
        return
    tinker_services.requests_refuse(model=served.row, why=f"the model's run ({run.pk}) was cancelled")
    if why == S.CANCELLING:
        run_transition(
            run, allowed=(S.CANCELLING,), to=S.CANCELLED, message=f"cancelled at step {served.step}"
        )


def _finish(served: Served, message: str, why: str) -> None:
    """The run succeeds: its session ended, or a wall-time or sandbox budget ran out (what is
    still queued is refused with `why`)."""
    tinker_services.requests_refuse(model=served.row, why=why)
    try:
        run_transition(served.run, allowed=(S.RUNNING,), to=S.SUCCEEDED, message=message)
    except StateError:  # paused or cancelled meanwhile: that ends it
        pass
