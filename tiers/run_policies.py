"""What a tier evaluation asks of runs: a run's policy version, as the checkpoint to evaluate.

Runs sit above tiers (a run launches on a tier), so runs answers through the resolver it registers
here in its AppConfig.ready (runs/tier_policies.py) and tiers imports none of runs, as the project
pages take the runs app's sections (projects/sections.py). With none registered, a tier evaluates
paths and hub ids only.
"""

from dataclasses import dataclass
from typing import Protocol

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

from tiers.models import Tier


@dataclass(frozen=True)
class RunPolicy:
    """A run's policy version: what the evaluation loads, and which run and version it records."""

    run_id: int
    version: int
    path: str  # the version's local folder; for version 0, the model the run started from


class RunPolicyResolver(Protocol):
    """The policy version `version` (None: the newest) of the run `run_id`, to evaluate under `tier`.
    Raises Http404 for a run the user may not view, ValidationError for a run of another project or
    a version it has not published."""

    def __call__(self, *, user: User, tier: Tier, run_id: int, version: int | None) -> RunPolicy: ...


RUN_POLICY_RESOLVERS: list[RunPolicyResolver] = []


def run_policy_resolver_register(resolver: RunPolicyResolver) -> None:
    """Register once: ready() may run more than once in tests."""
    if resolver not in RUN_POLICY_RESOLVERS:
        RUN_POLICY_RESOLVERS.append(resolver)


def run_policy_for(*, user: User, tier: Tier, run_id: int | None, version: int | None) -> RunPolicy | None:
    """The run's policy version to evaluate; None when no run is named (a path or hub id is)."""
    if run_id is None:
        if version is not None:
            raise ValidationError({"version": "a policy version needs a run"})
        return None
    if not RUN_POLICY_RESOLVERS:
        raise ValidationError({"run": "no runs app answers here: evaluate a path or hub id"})
    return RUN_POLICY_RESOLVERS[0](user=user, tier=tier, run_id=run_id, version=version)
