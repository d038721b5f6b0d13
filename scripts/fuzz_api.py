"""`make fuzz`: the REST API fuzzed from its live OpenAPI schema by schemathesis.

A fresh embedded Flywheel (SQLite and a private Redis in a temporary FLYWHEEL_HOME) is seeded
with a project, a launcher (not an owner) and what the endpoints act on (a task set version, a
reward rule, a tier, a run with a trajectory, a review queue, a webhook); the real web server
(uvicorn, as `make up` runs it) serves it; schemathesis generates requests from /api/v1/schema/ with
the launcher's token: schema examples, boundary values, and random valid and invalid input. The
run fails on any 5xx, any answer outside its declared schema or content type, and any crash.

Bounded: FUZZ_MAX_EXAMPLES cases per operation and phase (default 20), FUZZ_MAX_SECONDS for the
whole run (default 240), FUZZ_SEED for a reproducible run (default: random, printed). Reports
(JUnit, and a pytest file reproducing each failure) go to FUZZ_REPORT_DIR (default
FLYWHEEL_HOME/fuzz).
"""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKS = "not_a_server_error,response_schema_conformance,content_type_conformance"
PHASES = "examples,coverage,fuzzing"


def fuzz_environment(home: Path) -> dict[str, str]:
    from tests.web_server import free_port

    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    return env | {
        "FLYWHEEL_HOME": str(home),
        "FLYWHEEL_REDIS_PORT": str(free_port()),
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        "HF_HUB_OFFLINE": "1",  # tiers naming hub models are refused at once, without the network
        "FLYWHEEL_API_RATE": "1000000/min",  # the fuzzer's volume is not a client to throttle
        "FLYWHEEL_SANDBOX_WORKER_CHECK": "false",
    }


def seed(home: Path) -> dict:
    """Migrate the fresh database and make what the endpoints act on; the launcher's token."""
    import django

    django.setup()
    from django.core.management import call_command

    from core.roles import Role
    from projects import services as project_services
    from reviews import services as review_services
    from rewards import services as reward_services
    from runs import lifecycle, services
    from runs.lifecycle import RunRequest
    from runs.models import Trajectory
    from tiers import services as tier_services
    from webhooks import services as webhook_services

    call_command("migrate", verbosity=0)
    owner = services.User.objects.create_user(username="fuzz-owner", password="fuzz-owner-pw")
    launcher = services.User.objects.create_user(username="fuzz-launcher", password="fuzz-launcher-pw")
    project = project_services.project_create(name="fuzz", by=owner)
    project_services.member_add(project=project, username=launcher.username, role=Role.LAUNCHER)
    task_set = project_services.task_set_create(project=project, name="arith", by=owner)
    items = [{"id": f"q{i}", "prompt": f"{i} + {i}?", "reference": str(2 * i)} for i in range(6)]
    lines = [(json.dumps(item) + "\n").encode() for item in items]
    version = project_services.task_set_import(
        task_set=task_set, stream=lines, file_format="jsonl", by=owner
    ).version
    assert version is not None, "the fuzz fixture's import failed"
    spec = {"type": "string_check", "input": "{{ sample.output_text }}", "reference": "{{ item.reference }}"}
    rule = reward_services.reward_rule_create(
        project=project, name="exact", spec=spec | {"operation": "eq"}, by=owner
    )
    model = home / "models" / "none"
    model.mkdir(parents=True)
    tier = tier_services.tier_create(project=project, by=owner, name="cap", base_model=str(model))
    request = RunRequest(
        project=project,
        name="fuzzed",
        task_set_version=version,
        reward_rule_version=rule.versions.get(),
        tier=tier,
        hyperparameters={"group_size": 2},
        max_steps=2,
    )
    run = lifecycle.run_create(request=request, by=owner)
    item = version.items.order_by("position").first()
    assert item is not None
    Trajectory.objects.create(
        run=run, item=item, sample_index=0, policy_version=0, outcome="scored", reward=1.0
    )
    queue = review_services.queue_create(run=run, name="all", filters={}, by=owner)
    hook = webhook_services.webhook_create(
        project=project, by=owner, url="https://hooks.example.com/flywheel"
    )
    delivery = webhook_services.webhook_ping(webhook=hook)
    token_row, token = project_services.api_token_create(user=launcher, name="fuzz")
    ids = {
        "projects": project.pk,
        "task-sets": task_set.pk,
        "tasks": item.pk,
        "tiers": tier.pk,
        "runs": run.pk,
        "trajectories": run.trajectories.get().pk,
        "reward-rules": rule.pk,
        "review-queues": queue.pk,
        "webhooks": hook.pk,
        "tokens": token_row.pk,
    }
    others = {"number": 1, "user_id": launcher.pk, "delivery_id": delivery.pk}
    return {"token": token, "ids": ids, "others": others}


def config_toml(ids: dict[str, int], others: dict[str, int]) -> str:
    """Path ids pinned to the seeded objects (deletes excepted), so bodies and queries are fuzzed
    against things that exist rather than answered 404."""
    blocks = []
    for resource, value in ids.items():
        pinned = {"path.id": value} | {f"path.{name}": number for name, number in others.items()}
        pairs = ", ".join(f'"{name}" = {number}' for name, number in pinned.items())
        blocks.append(
            "[[operations]]\n"
            f'include-path-regex = "^/api/v1/{resource}/\\\\{{id\\\\}}"\n'
            'exclude-method = "DELETE"\n'
            f"parameters = {{ {pairs} }}\n"
        )
    # A body naming the project (creating a task set, a rule, a tier, a run) names the seeded one.
    return f'[parameters]\n"body.project" = {ids["projects"]}\n\n' + "\n".join(blocks)


def schemathesis_argv(url: str, token: str, report_dir: Path, seed_value: int, config: Path) -> list[str]:
    return [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file",
        str(config),
        "run",
        f"{url}/api/v1/schema/?format=json",
        "--url",
        url,
        "--header",
        f"Authorization: Bearer {token}",
        "--checks",
        CHECKS,
        "--phases",
        PHASES,
        "--max-examples",
        os.environ.get("FUZZ_MAX_EXAMPLES", "20"),
        "--max-time",
        os.environ.get("FUZZ_MAX_SECONDS", "240"),
        "--seed",
        str(seed_value),
        "--request-timeout",
        "30",
        "--workers",
        "2",
        "--suppress-health-check",
        "all",
        "--report",
        "junit,pytest",
        "--report-dir",
        str(report_dir),
    ]


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from tests.web_server import WebServer

    home = Path(tempfile.mkdtemp(prefix="flywheel-fuzz-"))
    env = fuzz_environment(home)
    os.environ.update(env)
    from webapp.embedded_redis import redis_start

    redis_start(home=home, port=int(env["FLYWHEEL_REDIS_PORT"]))
    try:
        seeded = seed(home)
        report_dir = Path(os.environ.get("FUZZ_REPORT_DIR", home / "fuzz"))
        seed_value = int(os.environ.get("FUZZ_SEED") or random.randrange(2**31))
        print(f"make fuzz: FUZZ_SEED={seed_value}, reports in {report_dir}", flush=True)
        config = home / "schemathesis.toml"
        config.write_text(config_toml(seeded["ids"], seeded["others"]))
        with WebServer(env, home / "web.log") as server:
            argv = schemathesis_argv(server.url, seeded["token"], report_dir, seed_value, config)
            code = subprocess.run(argv, cwd=home, env=env, check=False).returncode
        if code != 0:
            print(f"make fuzz: failed; the server's log is {home / 'web.log'}", file=sys.stderr)
        return code
    finally:
        from webapp import stack

        stack.process_stop("redis")
        if os.environ.get("FUZZ_KEEP") != "1":
            shutil.rmtree(home / "redis", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
