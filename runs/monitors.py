"""Run monitors: alerts a team wants before a bad run costs a week of compute.

`alerts_for` is pure: it reads a few metric series (a baseline window from the run's start and
its recent points) and the per-run thresholds, and says which monitors fire. `run_monitor` is
the service the learner calls after it writes a step's metrics: it loads those series, asks
`alerts_for`, and records each new alert as a warning event (kind "alert") with its evidence
(the points or the flagged trajectories it fired on), which the run page shows live. An alert
does not repeat while its condition holds: the same monitor fires again only `cooldown_steps`
steps later.

Alerts act: each monitor's action (`Run.monitor_actions`, per run) is `alert`, `pause`, which
pauses the run at once (the learner stops after its current step, with a checkpoint), or `stop`,
which ends the run as failed with the alert's message as its reason (the learner checkpoints and
stops). Every monitor alerts by default but `nothing_to_learn`, which stops: a run that learns
from no episode step after step is spending compute for nothing, and must not end "succeeded".
Every alert is also sent to the project's webhooks as a `run.alert` event, with the
evidence and what was done.
"""

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from statistics import fmean
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Count

from core.exceptions import StateError
from rewards.detectors import raises_alert
from runs import listeners
from runs.lifecycle import run_event, run_pause
from runs.models import MetricPoint, Run, RunEvent, Trajectory
from runs.monitor_settings import (
    DEFAULTS,
    actions_clean,
    actions_of,
    thresholds_clean,
    thresholds_of,
)

logger = logging.getLogger(__name__)

Series = Sequence[tuple[int, float]]

ERRORED = "episodes/errored_rate"
REWARD = "reward/mean"
HELDOUT = "heldout/pass_rate"
RESPONSE = "episodes/response_tokens"
ENTROPY = "learner/entropy"
ZERO_VARIANCE = "dropped/zero_variance"
LEARNED = "episodes/learned"
FLAGGED = "episodes/flagged_rate"
DROPPED_ERRORED = "dropped/errored"
DROPPED_STALE = "dropped/stale"
MISMATCH = "learner/mismatch_kl"
WATCHED = (
    ERRORED,
    REWARD,
    HELDOUT,
    RESPONSE,
    ENTROPY,
    ZERO_VARIANCE,
    LEARNED,
    FLAGGED,
    DROPPED_ERRORED,
    DROPPED_STALE,
    MISMATCH,
)


@dataclass(frozen=True)
class FlaggedWindow:
    """The recent steps' trajectories that raise a hacking alert (notes left out), newest first."""

    trajectories: list[int]  # ids of those not yet alerted on
    steps: list[int]  # each one's step (the policy version that generated it)
    episodes: int  # every episode of the window's steps
    notes: int = 0  # flagged only as notes in the window: shown on the trajectory, not counted
    detectors: dict[str, int] = field(default_factory=dict)

    @property
    def span(self) -> str:
        first, last = min(self.steps), max(self.steps)
        return f"step {first}" if first == last else f"steps {first}–{last}"


@dataclass(frozen=True)
class Alert:
    monitor: str
    message: str
    value: float
    threshold: float
    evidence: dict = field(default_factory=dict)


FLAGGED_EVIDENCE = 5  # flagged trajectories an alert shows in full
FLAGGED_IDS = 100  # flagged trajectories an alert links to
ESCALATION = 2.0  # a reward_hacking alert repeats within its cooldown when its share has grown this much
ACTED = {"pause": " The run pauses itself.", "stop": " The run stops as failed."}


def _points(points: Series) -> list[list[float]]:
    return [[step, round(value, 6)] for step, value in points]


def _mean(points: Series) -> float:
    return fmean(value for _, value in points)


def _windows(points: Series, window: int) -> tuple[Series, Series] | None:
    """The baseline (first `window` points) and the recent window, when they do not overlap."""
    if len(points) < 2 * window:
        return None
    return points[:window], points[-window:]


def _errored(series: Mapping[str, Series], t: Mapping[str, float]) -> Alert | None:
    points = series.get(ERRORED) or []
    if not points or points[-1][1] <= t["errored_rate_max"]:
        return None
    rate = points[-1][1]
    return Alert(
        "errored_rate",
        f"{rate:.0%} of episodes errored at step {points[-1][0]} (threshold {t['errored_rate_max']:.0%}): "
        "infrastructure is failing and those episodes are masked from learning",
        rate,
        t["errored_rate_max"],
        {ERRORED: _points(points[-int(t["window"]) :])},
    )


def _reward_without_heldout(series: Mapping[str, Series], t: Mapping[str, float]) -> Alert | None:
    window = int(t["window"])
    reward, heldout = series.get(REWARD) or [], series.get(HELDOUT) or []
    if len(reward) < window or len(heldout) < 2:
        return None
    recent = reward[-window:]
    third = max(window // 3, 1)
    rise = _mean(recent[-third:]) - _mean(recent[:third])
    start = recent[0][0]
    before = [point for point in heldout if point[0] <= start] or heldout[:1]
    moved = heldout[-1][1] - before[-1][1]
    if rise < t["reward_rise_min"] or heldout[-1][0] <= before[-1][0] or abs(moved) > t["heldout_flat_max"]:
        return None
    return Alert(
        "reward_without_heldout",
        f"train reward rose by {rise:.3f} over the last {window} steps while held-out pass rate moved "
        f"{moved:+.3f}: the policy may be fitting the reward, not the task",
        rise,
        t["reward_rise_min"],
        {REWARD: _points(recent), HELDOUT: _points([before[-1], heldout[-1]])},
    )


def _response_drift(series: Mapping[str, Series], t: Mapping[str, float]) -> Alert | None:
    windows = _windows(series.get(RESPONSE) or [], int(t["window"]))
    if windows is None or _mean(windows[0]) <= 0:
        return None
    baseline, recent = _mean(windows[0]), _mean(windows[1])
    drift = (recent - baseline) / baseline
    if abs(drift) <= t["response_drift_max"]:
        return None
    return Alert(
        "response_length_drift",
        f"response length drifted {drift:+.0%} (from {baseline:.1f} to {recent:.1f} tokens)",
        drift,
        t["response_drift_max"],
        {"baseline": _points(windows[0]), "recent": _points(windows[1]), "metric": RESPONSE},
    )


def _entropy(series: Mapping[str, Series], t: Mapping[str, float]) -> Alert | None:
    windows = _windows(series.get(ENTROPY) or [], int(t["window"]))
    if windows is None or _mean(windows[0]) <= 0:
        return None
    baseline, recent = _mean(windows[0]), _mean(windows[1])
    lost = 1 - recent / baseline
    if lost <= t["entropy_drop_max"]:
        return None
    return Alert(
        "entropy_collapse",
        f"policy entropy collapsed by {lost:.0%} (from {baseline:.3f} to {recent:.3f}): "
        "exploration has stopped",
        lost,
        t["entropy_drop_max"],
        {"baseline": _points(windows[0]), "recent": _points(windows[1]), "metric": ENTROPY},
    )


def zero_variance_shares(series: Mapping[str, Series]) -> list[tuple[int, float]]:
    """Per step: groups dropped for equal rewards over those plus the episodes learned from."""
    learned = dict(series.get(LEARNED) or [])
    shares = []
    for step, dropped in series.get(ZERO_VARIANCE) or []:
        total = dropped + learned.get(step, 0.0)
        if total > 0:
            shares.append((step, dropped / total))
    return shares


def _zero_variance(series: Mapping[str, Series], t: Mapping[str, float]) -> Alert | None:
    shares = zero_variance_shares(series)
    window = int(t["window"])
    if len(shares) < window + 1:
        return None
    recent = _mean(shares[-window:])
    earlier = _mean(shares[:-window][-window:])
    if recent <= t["zero_variance_share_max"] or recent <= earlier:
        return None
    return Alert(
        "zero_variance_groups",
        f"{recent:.0%} of the last {window} steps' episodes were dropped for groups whose rewards "
        f"do not vary (was {earlier:.0%}): the task is too easy or too hard for the policy",
        recent,
        t["zero_variance_share_max"],
        {"shares": _points(shares[-2 * window :])},
    )


def _hacking_rate(series: Mapping[str, Series], t: Mapping[str, float]) -> Alert | None:
    """The policy is exploiting, not stumbling: a share of a whole step's episodes is flagged.

    >>> _hacking_rate({"episodes/flagged_rate": [(1, 0.1), (2, 0.5)]}, DEFAULTS).monitor
    'hacking_rate'
    """
    points = series.get(FLAGGED) or []
    if not points or points[-1][1] <= t["flagged_rate_max"]:
        return None
    step, rate = points[-1]
    return Alert(
        "hacking_rate",
        f"{rate:.0%} of step {step}'s episodes were flagged by the reward-hacking detectors "
        f"(threshold {t['flagged_rate_max']:.0%}): the policy is exploiting the reward; review them.",
        rate,
        t["flagged_rate_max"],
        {FLAGGED: _points(points[-int(t["window"]) :])},
    )


def _nothing_learned(series: Mapping[str, Series], t: Mapping[str, float]) -> Alert | None:
    """No episode learned from for `nothing_learned_steps` steps in a row, with why and what to change.

    >>> steps = {"episodes/learned": [(s, 0.0) for s in range(1, 6)],
    ...          "dropped/zero_variance": [(s, 16.0) for s in range(1, 6)]}
    >>> _nothing_learned(steps, DEFAULTS).message.split(":")[0]
    'nothing to learn'
    >>> _nothing_learned(steps | {"episodes/learned": [(1, 0.0), (2, 4.0)] + steps["episodes/learned"][2:]},
    ...     DEFAULTS) is None
    True
    """
    needed = int(t["nothing_learned_steps"])
    learned = list(series.get(LEARNED) or [])[-needed:]
    if len(learned) < needed or any(value > 0 for _, value in learned):
        return None
    steps = {step for step, _ in learned}

    def dropped(name: str) -> float:
        return sum(value for step, value in series.get(name) or [] if step in steps)

    equal, errored, stale = dropped(ZERO_VARIANCE), dropped(DROPPED_ERRORED), dropped(DROPPED_STALE)
    span = f"steps {learned[0][0]}–{learned[-1][0]}"
    if equal >= max(errored, stale):
        why = (
            f"every group had equal rewards in {span} ({equal:g} episodes, none learnable). Change: a "
            "larger group size or a higher temperature (more varied samples), tasks nearer the "
            "policy's level (all failing or all passing teaches nothing), or a rule with partial credit"
        )
    elif errored >= stale:
        why = f"every episode errored in {span} ({errored:g}): fix the sandbox or the rule's harness"
    else:
        why = f"every episode was staler than the staleness bound in {span} ({stale:g}): raise it"
    return Alert(
        "nothing_to_learn", f"nothing to learn: {why}.", 0.0, float(needed), {LEARNED: _points(learned)}
    )


def _hacking(window: FlaggedWindow | None, t: Mapping[str, float]) -> Alert | None:
    """A group, not a trickle: `hacking_flags_min` newly flagged trajectories in the window that
    are at least `hacking_share_min` of its episodes; the value is that share.

    >>> w = FlaggedWindow(trajectories=[9, 8, 7], steps=[8, 6, 3], episodes=40, detectors={"early_exit": 3})
    >>> alert = _hacking(w, DEFAULTS)
    >>> alert.message.split(",")[0], alert.value
    ('3 trajectories in steps 3–8 were flagged by the reward-hacking detectors', 0.075)
    >>> _hacking(FlaggedWindow(trajectories=[9, 8], steps=[8, 8], episodes=40), DEFAULTS) is None
    True
    """
    if window is None or not window.trajectories or window.episodes <= 0:
        return None
    count = len(window.trajectories)
    share = count / window.episodes
    if count < max(t["hacking_flags_min"], 1) or share < t["hacking_share_min"]:
        return None
    kinds = ", ".join(f"{name} {n}" for name, n in sorted(window.detectors.items(), key=lambda kv: -kv[1]))
    noted = f"; {window.notes} more flagged only as notes, with no reward to gain" if window.notes else ""
    return Alert(
        "reward_hacking",
        f"{count} trajectories in {window.span} were flagged by the reward-hacking detectors, "
        f"{share:.0%} of the {window.episodes} episodes of those steps ({kinds}{noted}): review them.",
        share,
        t["hacking_share_min"],
    )


def _mismatch(series: Mapping[str, Series], t: Mapping[str, float]) -> Alert | None:
    points = list(series.get(MISMATCH) or [])[-int(t["window"]) :]
    if not points:
        return None
    recent = _mean(points)
    if recent <= t["mismatch_kl_max"]:
        return None
    return Alert(
        "logprob_mismatch",
        f"the decoder and the learner disagree on the sampled tokens (KL {recent:.4f} over the last "
        f"{len(points)} steps, above {t['mismatch_kl_max']:g}): the updates are off-policy in a way the "
        "loss does not see; match their precision, or set tis_cap to correct for it",
        recent,
        t["mismatch_kl_max"],
        {"recent": _points(points), "metric": MISMATCH},
    )


def alerts_for(
    series: Mapping[str, Series], thresholds: Mapping[str, float], *, flagged: FlaggedWindow | None = None
) -> list[Alert]:
    """The monitors that fire on these series (each by step, oldest first: a baseline window
    from the run's start, then its recent points) and the window's newly flagged trajectories.

    >>> healthy = {"episodes/errored_rate": [(1, 0.0), (2, 0.05)]}
    >>> alerts_for(healthy, DEFAULTS)
    []
    >>> [a.monitor for a in alerts_for({"episodes/errored_rate": [(1, 0.5)]}, DEFAULTS)]
    ['errored_rate']
    """
    t = DEFAULTS | dict(thresholds)
    checks = [
        _errored(series, t),
        _reward_without_heldout(series, t),
        _response_drift(series, t),
        _entropy(series, t),
        _zero_variance(series, t),
        _hacking(flagged, t),
        _hacking_rate(series, t),
        _nothing_learned(series, t),
        _mismatch(series, t),
    ]
    return [alert for alert in checks if alert is not None]


# --- the service -----------------------------------------------------------------------------


def _series(run: Run, window: int, recent: int) -> dict[str, list[tuple[int, float]]]:
    """Each watched metric's first `window` points and its last `recent`, by step."""
    series = {}
    for name in WATCHED:
        points = MetricPoint.objects.filter(run=run, name=name)
        first = list(points.order_by("step", "pk").values_list("step", "value")[:window])
        last = list(points.order_by("-step", "-pk").values_list("step", "value")[:recent])[::-1]
        merged = dict(first) | dict(last)
        if merged:
            series[name] = sorted(merged.items())
    if ZERO_VARIANCE in series and LEARNED not in series:
        steps = [step for step, _ in series[ZERO_VARIANCE]]
        learned = (
            Trajectory.objects.filter(run=run, learned_in_step__in=[step - 1 for step in steps])
            .values("learned_in_step")
            .annotate(count=Count("pk"))
        )
        series[LEARNED] = sorted(
            (row["learned_in_step"] + 1, float(row["count"]))
            for row in learned
            if row["learned_in_step"] is not None  # never, filtered by step above; typed optional
        )
    return series


def _last_alerts(run: Run) -> dict[str, dict]:
    """Each monitor's newest alert's data."""
    last: dict[str, dict] = {}
    for data in run.events.filter(kind="alert").order_by("-pk").values_list("data", flat=True)[:200]:
        last.setdefault(data.get("monitor", ""), data)
    return last


def run_monitor(*, run_id: int, step: int) -> list[RunEvent]:
    """Check the run's monitors after `step`'s metrics are written; record each new alert.

    Never raises: a monitor that cannot run must not stop the learner.
    """
    try:
        return _run_monitor(run_id=run_id, step=step)
    except Exception:  # noqa: BLE001 - alerts are advice; the learner's step already committed
        logger.warning("run %s: monitors failed at step %s", run_id, step, exc_info=True)
        return []


def flagged_window(run: Run, step: int, window: int, *, after: int = 0) -> FlaggedWindow:
    """The trajectories of the last `window` steps whose flags raise an alert, those with ids above
    `after` (the newest one an earlier alert covered), and how many episodes those steps hold."""
    recent = Trajectory.objects.filter(run=run, policy_version__gte=max(step - window, 0))
    ids: list[int] = []
    steps: list[int] = []
    notes = 0
    detectors: dict[str, int] = {}
    flagged = recent.exclude(flags=[]).order_by("-pk").values_list("pk", "policy_version", "flags")
    for pk, version, flags in flagged:
        if not raises_alert(flags):
            notes += 1
        elif pk > after:
            ids.append(pk)
            steps.append(version)
            for name in {flag.get("detector", "?") for flag in flags if not flag.get("note")}:
                detectors[name] = detectors.get(name, 0) + 1
    return FlaggedWindow(ids, steps, recent.count(), notes, detectors)


def flagged_evidence(run: Run, window: FlaggedWindow) -> dict[str, Any]:
    """What an alert links to: every flagged trajectory of its group by id, their steps, and the
    newest few in full (what a reviewer opens first)."""
    newest = Trajectory.objects.filter(run=run, pk__in=window.trajectories[:FLAGGED_EVIDENCE])
    shown = [
        {
            "trajectory": trajectory.pk,
            "item": trajectory.item.external_id,
            "step": trajectory.policy_version,
            "reward": trajectory.reward,
            "flags": [flag for flag in trajectory.flags if not flag.get("note")][:3],
            "completion": trajectory.completion_text[:300],
        }
        for trajectory in newest.select_related("item").order_by("-pk")
    ]
    return {
        "flagged": shown,
        "trajectories": window.trajectories[:FLAGGED_IDS],
        "steps": [min(window.steps), max(window.steps)] if window.steps else [],
        "episodes": window.episodes,
        "notes": window.notes,
        "detectors": window.detectors,
    }


def _run_monitor(*, run_id: int, step: int) -> list[RunEvent]:
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return []
    t = thresholds_of(run)
    last = _last_alerts(run)
    covered = int(last.get("reward_hacking", {}).get("newest_trajectory", 0))
    new = flagged_window(run, step, int(t["window"]), after=covered)
    actions = actions_of(run)
    recorded = []
    recent = max(4 * int(t["window"]), int(t["nothing_learned_steps"]))
    for alert in alerts_for(_series(run, int(t["window"]), recent), t, flagged=new):
        previous = last.get(alert.monitor)
        if (
            previous is not None
            and step - int(previous.get("step", -(10**9))) < t["cooldown_steps"]
            and not _escalated(alert, previous)
        ):
            continue
        data = asdict(alert) | {"step": step, "action": actions[alert.monitor]}
        if alert.monitor == "reward_hacking":
            data["newest_trajectory"] = max(new.trajectories)
            data["evidence"] = flagged_evidence(run, new)
        if alert.monitor == "hacking_rate":
            window = flagged_window(run, step, int(t["window"]))
            data["evidence"] = alert.evidence | flagged_evidence(run, window)
        message = alert.message + ACTED.get(actions[alert.monitor], "")
        event = run_event(run, "alert", message, level=RunEvent.Level.WARNING, data=data)
        recorded.append(event)
        _act(run, event, data)
    return recorded


def _escalated(alert: Alert, previous: Mapping[str, Any]) -> bool:
    """A hacking alert repeats within its cooldown only when its rate has grown `ESCALATION`-fold."""
    if alert.monitor != "reward_hacking":
        return False
    return alert.value >= ESCALATION * float(previous.get("value") or 0.0) > 0


def _act(run: Run, event: RunEvent, data: dict[str, Any]) -> None:
    """Pause the run when the monitor says so, and tell the project's webhooks either way."""
    done = "stopped" if data["action"] == "stop" else "none"  # the learner ends the run (run_learner)
    if data["action"] == "pause":
        try:
            run_pause(run=Run.objects.get(pk=run.pk))
            done = "paused"
        except StateError as exc:  # already pausing, paused or ending: nothing more to do
            done = f"not paused: {exc}"
    listeners.alert_raised(run=Run.objects.get(pk=run.pk), event=event, alert=data, done=done)


def run_monitors_set(
    *, run: Run, changes: Mapping[str, float | None], actions: Mapping[str, str] | None = None
) -> Run:
    """Merge threshold changes into the run's (None restores a default) and set monitors'
    actions (alert or pause); refused by name, all or nothing."""
    clean = thresholds_clean({name: value for name, value in changes.items() if value is not None})
    unknown = sorted(name for name in changes if name not in DEFAULTS)
    if unknown:
        raise ValidationError({name: "unknown monitor setting" for name in unknown})
    chosen = actions_clean(actions or {})
    merged = {name: value for name, value in (run.monitors or {}).items() if changes.get(name, 0) is not None}
    merged |= clean
    kept = {
        name: action for name, action in (run.monitor_actions or {}).items() if name not in (actions or {})
    }
    Run.objects.filter(pk=run.pk).update(monitors=merged, monitor_actions=kept | chosen)
    run.monitors, run.monitor_actions = merged, kept | chosen
    return run
