"""The `flywheel` command: list and show projects, task sets and their versions, tiers, reward rules
and their versions, runs and checkpoints (the ids other commands take, in tables); launch, follow,
pause, resume and cancel runs; import tasks; log traces; export data and checkpoints; play a run's
episodes with a `verifiers` environment and score models with its rubric (`flywheel env`). Progress
bars go to stderr; `--json` (before or after the subcommand) prints the API's JSON instead of tables.

Configuration as the client's: --url / FLYWHEEL_URL, --token / FLYWHEEL_TOKEN."""

import argparse
import asyncio
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from flywheel import environments
from flywheel.client import Client
from flywheel.errors import APIError, FlywheelError

TERMINAL = ("succeeded", "failed", "cancelled")
TRACE_BATCH = 100
DEFAULT_ROWS = 50
Column = tuple[str, Callable[[dict], Any]]


def parse_value(text: str) -> Any:
    """A hyperparameter's value: JSON when it parses (numbers, true, "auto"), else the text.

    >>> parse_value("3e-4"), parse_value("auto"), parse_value("true")
    (0.0003, 'auto', True)
    """
    try:
        return json.loads(text)
    except ValueError:
        return text


def key_values(pairs: list[str]) -> dict[str, Any]:
    values = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key:
            raise FlywheelError(f"--hp takes name=value; got {pair!r}")
        values[key] = parse_value(value)
    return values


class Output:
    """Human lines, or one JSON document, on stdout; progress bars on stderr."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def result(self, data: Any, human: str) -> None:
        print(json.dumps(data, indent=2) if self.as_json else human)

    def bar(self, **kwargs: Any) -> tqdm:
        shown = sys.stderr.isatty() or "FLYWHEEL_PROGRESS" in os.environ
        return tqdm(file=sys.stderr, disable=not shown, **kwargs)


def cell(value: Any) -> str:
    """A value as a table shows it: text as it is, None as -, numbers without trailing zeros."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return " ".join(str(value).split())  # one line, whatever the text held


def table(rows: list[dict], columns: list[Column]) -> str:
    """Rows under upper-case headers, each column as wide as its widest cell.

    >>> rows = [{"id": 3, "name": "a"}, {"id": 12, "name": "bb"}]
    >>> print(table(rows, [("ID", field("id")), ("NAME", field("name"))]))
    ID  NAME
    3   a
    12  bb
    """
    cells = [[header for header, _ in columns]] + [[cell(get(row)) for _, get in columns] for row in rows]
    widths = [max(len(line[index]) for line in cells) for index in range(len(columns))]
    return "\n".join(
        "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
        for line in cells
    )


def details(record: dict, skip: Iterable[str] = ()) -> str:
    """One `field: value` line per field of a record, a nested object's fields as `field.name`."""
    flat = dict(flatten(record, skip=set(skip)))
    width = max((len(key) for key in flat), default=0)
    return "\n".join(f"{key.ljust(width)}  {cell(value)}" for key, value in flat.items())


def flatten(record: dict, *, skip: set[str], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in record.items():
        if key in skip:
            continue
        if isinstance(value, dict) and value:
            yield from flatten(value, skip=set(), prefix=f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def first(rows: Iterator[dict], count: int) -> list[dict]:
    """At most `count` rows of a list that may have many pages."""
    taken: list[dict] = []
    for row in rows:
        if len(taken) >= count:
            break
        taken.append(row)
    return taken


def page_size(count: int) -> int:
    return max(1, min(count, 100))


def hint(text: str, out: Output) -> None:
    """A pointer for people (on stderr, so that stdout stays the table)."""
    if not out.as_json:
        print(text, file=sys.stderr)


def field(name: str, *path: str) -> Callable[[dict], Any]:
    def get(row: dict) -> Any:
        value = row.get(name)
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    return get


def run_line(run: dict) -> str:
    progress = run.get("progress") or {}
    step = f"{progress.get('learner_step', 0)}/{progress.get('max_steps', '?')}"
    return f"{run['id']:>6}  {run['status']:<10}  {run['method']:<6}  step {step:<9}  {run['name']}"


# --- runs ----------------------------------------------------------------------------------


def runs_launch(client: Client, args: argparse.Namespace, out: Output) -> int:
    options = {
        name: getattr(args, name)
        for name in (
            "max_wall_seconds",
            "priority",
            "train_split",
            "eval_split",
            "budget_money",
            "budget_device_hours",
        )
        if getattr(args, name) is not None
    }
    run = client.runs.launch(
        project=args.project,
        name=args.name,
        task_set_version=args.task_set_version,
        reward_rule_version=args.reward_rule_version,
        tier=args.tier,
        method=args.method,
        hyperparameters=key_values(args.hp),
        max_steps=args.max_steps,
        **options,
    )
    if args.follow:
        return follow_run(client, run["id"], out)
    out.result(run, f"launched run {run['id']} ({run['name']}): {run['status']}")
    return 0


def runs_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    listing = client.runs.list(project=args.project, status=args.status, limit=page_size(args.limit))
    runs = first(listing, args.limit)
    header = f"{'ID':>6}  {'STATUS':<10}  {'METHOD':<6}  {'PROGRESS':<14}  NAME"
    out.result(runs, "\n".join([header, *(run_line(run) for run in runs)]) if runs else "no runs")
    return 0


def follow_run(client: Client, run_id: int, out: Output) -> int:
    """A progress bar of learner steps and the run's events as they come, until it ends."""
    run: dict = {}
    events: list[dict] = []
    bar = None
    for message in client.follow(run_id):
        kind, payload = message["event"], message["payload"]
        if kind == "run":
            run = payload
            total = run["progress"]["max_steps"]
            if bar is None:
                bar = out.bar(total=total, desc=f"run {run_id}", unit="step")
            bar.n = run["progress"]["learner_step"]
            bar.refresh()
        elif kind == "event":
            events.append(payload)
            if not out.as_json:
                tqdm.write(f"[{payload['level']}] {payload['message']}", file=sys.stderr)
        elif kind == "metrics" and bar is not None:
            step = payload.get("step")
            if isinstance(step, int) and step > bar.n:
                bar.update(step - bar.n)
    if bar is not None:
        bar.close()
    reason = stop_reason(client, run, events) if stopped_early(run) else None
    if reason and not out.as_json:
        print(f"run {run_id} {run.get('status')} at step {step_of(run)}: {reason}", file=sys.stderr)
    out.result({"run": run, "events": events, "stop_reason": reason}, run_line(run))
    return 0 if run.get("status") == "succeeded" else 1


def step_of(run: dict) -> str:
    progress = run.get("progress") or {}
    return f"{progress.get('learner_step', 0)}/{progress.get('max_steps', '?')}"


def stopped_early(run: dict) -> bool:
    """Ended other than by finishing its steps: failed, cancelled, or succeeded short of max_steps."""
    if run.get("status") not in TERMINAL:
        return False
    progress = run.get("progress") or {}
    short = progress.get("learner_step", 0) < progress.get("max_steps", 0)
    return run.get("status") != "succeeded" or short


def stop_reason(client: Client, run: dict, events: list[dict] | None = None) -> str | None:
    """Why a run ended early, as the server recorded it: its error (where, and the log's last
    line), else its last status event ("cancelled at step 3", "succeeded: stopped early, ..."),
    else its last error event."""
    error = run.get("error")
    if error and error.get("message"):
        where = f" ({error['where']})" if error.get("where") else ""
        return f"{summary_of(error['message'])}{where}"
    if events is None:  # newest first: a page of them is enough
        events = list(reversed(first(client.runs.events(run["id"], limit=50), 50)))
    for kinds in ({"status"}, {"error"}):
        chosen = [e for e in events if e.get("kind") in kinds or e.get("level") in kinds]
        if chosen:
            return summary_of(chosen[-1]["message"])
    return None


def summary_of(text: str) -> str:
    r"""A message that may carry a log after its first line: that line, and the log's last.

    >>> summary_of("learner died; gave up after 3 restarts\n  step 4\nRuntimeError: out of memory\n")
    'learner died; gave up after 3 restarts; the log ends: RuntimeError: out of memory'
    """
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[0] if len(lines) == 1 else f"{lines[0]}; the log ends: {lines[-1]}"


def runs_follow(client: Client, args: argparse.Namespace, out: Output) -> int:
    return follow_run(client, args.run, out)


def runs_action(client: Client, args: argparse.Namespace, out: Output) -> int:
    run = getattr(client.runs, args.action)(args.run)
    out.result(run, f"run {run['id']} is {run['status']}")
    return 0


# --- tasks, traces, exports ----------------------------------------------------------------


class ProgressFile:
    """A binary file that moves a progress bar as it is read (the upload's progress)."""

    def __init__(self, path: Path, bar: tqdm) -> None:
        self.handle, self.bar, self.name = open(path, "rb"), bar, str(path)  # noqa: SIM115

    def read(self, size: int = -1) -> bytes:
        chunk = self.handle.read(size)
        self.bar.update(len(chunk))
        return chunk

    def seek(self, offset: int, whence: int = 0) -> int:
        self.bar.reset()
        return self.handle.seek(offset, whence)

    def tell(self) -> int:
        return self.handle.tell()

    def close(self) -> None:
        self.handle.close()


def tasks_import(client: Client, args: argparse.Namespace, out: Output) -> int:
    path = Path(args.file)
    bar = out.bar(total=path.stat().st_size, desc=f"upload {path.name}", unit="B", unit_scale=True)
    upload = ProgressFile(path, bar)
    try:
        options = {"dry_run": args.dry_run, "format": args.format}
        version = client.task_sets.import_file(args.task_set, upload, **options)
    finally:
        upload.close()
        bar.close()
    out.result(version, import_summary(version, args.task_set, dry_run=args.dry_run))
    return 1 if version.get("error_count") else 0  # a dry run that found errors: scripts can tell


def import_summary(version: dict, task_set: int, *, dry_run: bool) -> str:
    """What an import did, with the version's id that `runs launch --task-set-version` takes."""
    if dry_run:
        problems = [
            f"  line {e.get('line')}: {e.get('param') or ''} {e.get('message')}"
            for e in version.get("errors", [])
        ]
        counts = f"{version.get('item_count')} items (split {cell(version.get('split_counts'))})"
        summary = f"would import {counts} into task set {task_set}; nothing written"
        if version.get("error_count"):
            summary += f"\nerrors ({version['error_count']}, the first shown):\n" + "\n".join(problems)
        return summary
    what = "imported" if version.get("created", True) else "unchanged: the same content as"
    items = f" {version.get('item_count')} items as" if version.get("created", True) else ""
    return (
        f"{what}{items} version {version.get('number')} of task set {task_set}; its id is {version.get('id')}"
        f" (runs launch --task-set-version {version.get('id')})"
    )


def tasks_create(client: Client, args: argparse.Namespace, out: Output) -> int:
    """A new task set with the file as its first version; a refused file creates nothing."""
    path = Path(args.file)
    bar = out.bar(total=path.stat().st_size, desc=f"upload {path.name}", unit="B", unit_scale=True)
    upload = ProgressFile(path, bar)
    try:
        options = {"dry_run": args.dry_run, "format": args.format, "description": args.description}
        created = client.task_sets.create(args.project, args.name, file=upload, **options)
    finally:
        upload.close()
        bar.close()
    if args.dry_run:
        out.result(created, f"would create {args.name} with {created.get('item_count')} items")
    else:
        version = created.get("version") or {}
        summary = import_summary(version, created.id, dry_run=False)
        out.result(created, f"created task set {created.id}; {summary}")
    return 0


def trace_records(args: argparse.Namespace) -> Iterator[dict]:
    if args.prompt is not None:
        fields = {"id": args.id, "prompt": args.prompt, "completion": args.completion, "model": args.model}
        yield {key: value for key, value in fields.items() if value is not None}
        return
    from_stdin = args.file in (None, "-")
    handle: IO[str] = sys.stdin if from_stdin else open(args.file, encoding="utf-8")  # noqa: SIM115
    with handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError as exc:
                    raise FlywheelError(
                        f"line {number} of {args.file or 'stdin'} is not JSON: {exc}"
                    ) from exc


def traces_log(client: Client, args: argparse.Namespace, out: Output) -> int:
    """Report traces from a JSONL file (or one from --prompt), in batches, as the API takes them."""
    totals = {"received": 0, "created": 0, "updated": 0, "unchanged": 0}
    bar = out.bar(desc="traces", unit="trace")
    batch: list[dict] = []

    def send() -> None:
        answer = client.traces.ingest(args.project, batch)
        for key in totals:
            totals[key] += answer[key]
        bar.update(len(batch))
        batch.clear()

    for record in trace_records(args):
        record["id"] = record.get("id") or str(uuid.uuid4())
        batch.append(record)
        if len(batch) >= TRACE_BATCH:
            send()
    if batch:
        send()
    bar.close()
    human = f"{totals['created']} created, {totals['updated']} updated, {totals['unchanged']} unchanged"
    out.result(totals, human)
    return 0


def export(client: Client, args: argparse.Namespace, out: Output) -> int:
    if args.run is not None:
        lines = client.reviews.export(args.run, args.kind)
        what = f"run {args.run} {args.kind}"
    elif args.task_set is not None and args.version is not None:
        lines = client.task_sets.export(args.task_set, args.version)
        what = f"task set {args.task_set} v{args.version}"
    else:
        raise FlywheelError("export needs --run RUN, or --task-set SET --version N")
    to_stdout = args.output in (None, "-")
    target: IO[str] = sys.stdout if to_stdout else open(args.output, "w", encoding="utf-8")  # noqa: SIM115
    count = 0
    with out.bar(desc=f"export {what}", unit="line") as bar:
        try:
            for line in lines:
                target.write(json.dumps(line, ensure_ascii=False) + "\n")
                count += 1
                bar.update(1)
        finally:
            if target is not sys.stdout:
                target.close()
    if target is not sys.stdout or out.as_json:
        summary = {"lines": count, "output": args.output}
        print(
            json.dumps(summary) if out.as_json else f"wrote {count} lines to {args.output}", file=sys.stderr
        )
    return 0


def default_step(client: Client, run: int) -> int:
    """The run's best checkpoint's step (by its best_metric), else its newest checkpoint's."""
    best = client.runs.get(run).get("best_checkpoint")
    if best is not None:
        return int(best["step"])
    newest = max((checkpoint["step"] for checkpoint in client.checkpoints.list(run=run)), default=None)
    if newest is None:
        raise FlywheelError(f"run {run} has no checkpoint yet")
    return int(newest)


def checkpoints_export(client: Client, args: argparse.Namespace, out: Output) -> int:
    """A checkpoint as a save_pretrained folder with a model card, archived, with a progress bar;
    without a step, the run's best checkpoint."""
    if args.step is None:
        args.step = default_step(client, args.run)
    target = args.output or f"run-{args.run}-step-{args.step}.{args.archive}"
    with out.bar(desc=f"export run {args.run} step {args.step}", unit="B", unit_scale=True) as bar:
        path = client.checkpoints.export(
            args.run, args.step, target, archive=args.archive, weights=args.weights, progress=bar.update
        )
    size = path.stat().st_size
    out.result({"output": str(path), "bytes": size}, f"wrote {size} bytes to {path}")
    return 0


# --- listing and showing what other commands take ids of ----------------------------------


PROJECT_COLUMNS: list[Column] = [
    ("ID", field("id")),
    ("NAME", field("name")),
    ("CREATED", field("created_at")),
]
TASK_SET_COLUMNS: list[Column] = [
    ("ID", field("id")),
    ("PROJECT", field("project")),
    ("NAME", field("name")),
    ("CREATED", field("created_at")),
]
TASK_SET_VERSION_COLUMNS: list[Column] = [
    ("ID", field("id")),
    ("VERSION", field("number")),
    ("ITEMS", field("item_count")),
    ("SPLIT", field("split_counts")),
    ("SOURCE", field("source_name")),
    ("CREATED", field("created_at")),
]
TIER_COLUMNS: list[Column] = [
    ("ID", field("id")),
    ("PROJECT", field("project")),
    ("NAME", field("name")),
    ("ENGINE", field("engine")),
    ("BASE MODEL", field("base_model")),
]
RULE_COLUMNS: list[Column] = [
    ("ID", field("id")),
    ("PROJECT", field("project")),
    ("NAME", field("name")),
    ("VERSIONS", field("version_count")),
    ("LATEST ID", field("latest_version", "id")),
]
RULE_VERSION_COLUMNS: list[Column] = [
    ("ID", field("id")),
    ("VERSION", field("number")),
    ("TYPE", field("spec", "type")),
    ("USED", field("is_used")),
    ("NOTE", field("note")),
    ("CREATED", field("created_at")),
]
CHECKPOINT_COLUMNS: list[Column] = [
    ("ID", field("id")),
    ("RUN", field("run")),
    ("STEP", field("step")),
    ("HELD-OUT PASS", field("heldout_pass_rate")),
    ("HELD-OUT REWARD", field("heldout_reward")),
    ("BEST", lambda row: "best" if row.get("best") else ""),
]
VERSION_HINT = "runs launch takes the ID column (--task-set-version ID), not the VERSION number"
RULE_HINT = "runs launch takes a version's ID (--reward-rule-version ID), not its VERSION number"


def listed(rows: list[dict], columns: list[Column], out: Output, nothing: str) -> int:
    out.result(rows, table(rows, columns) if rows else nothing)
    return 0


def projects_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    rows = first(client.projects.list(limit=page_size(args.limit)), args.limit)
    return listed(rows, PROJECT_COLUMNS, out, "no projects")


def projects_show(client: Client, args: argparse.Namespace, out: Output) -> int:
    project = client.projects.get(args.project)
    out.result(project, details(project))
    return 0


def task_sets_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    rows = first(client.task_sets.list(project=args.project, limit=page_size(args.limit)), args.limit)
    return listed(rows, TASK_SET_COLUMNS, out, "no task sets")


def task_sets_show(client: Client, args: argparse.Namespace, out: Output) -> int:
    task_set = client.task_sets.get(args.task_set)
    versions = first(client.task_sets.versions(args.task_set, limit=page_size(args.limit)), args.limit)
    human = f"{details(task_set)}\n\nversions:\n" + (
        table(versions, TASK_SET_VERSION_COLUMNS) if versions else "none yet"
    )
    out.result(task_set | {"versions": versions}, human)
    if versions:
        hint(VERSION_HINT, out)
    return 0


def task_sets_versions(client: Client, args: argparse.Namespace, out: Output) -> int:
    rows = first(client.task_sets.versions(args.task_set, limit=page_size(args.limit)), args.limit)
    listed(rows, TASK_SET_VERSION_COLUMNS, out, f"task set {args.task_set} has no versions yet")
    if rows:
        hint(VERSION_HINT, out)
    return 0


def task_sets_version(client: Client, args: argparse.Namespace, out: Output) -> int:
    version = client.task_sets.version(args.task_set, args.number)
    out.result(version, details(version))
    hint(f"runs launch --task-set-version {version['id']}", out)
    return 0


def tiers_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    rows = first(client.tiers.list(project=args.project, limit=page_size(args.limit)), args.limit)
    return listed(rows, TIER_COLUMNS, out, "no tiers")


def tiers_show(client: Client, args: argparse.Namespace, out: Output) -> int:
    tier = client.tiers.get(args.tier)
    out.result(tier, details(tier))
    return 0


def reward_rules_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    rows = first(client.reward_rules.list(project=args.project, limit=page_size(args.limit)), args.limit)
    listed(rows, RULE_COLUMNS, out, "no reward rules")
    if rows:
        hint("runs launch takes a version's ID (--reward-rule-version ID): LATEST ID is the newest's", out)
    return 0


def reward_rules_show(client: Client, args: argparse.Namespace, out: Output) -> int:
    rule = client.reward_rules.get(args.rule)
    versions = first(client.reward_rules.versions(args.rule, limit=page_size(args.limit)), args.limit)
    human = f"{details(rule, skip=('latest_version',))}\n\nversions:\n{table(versions, RULE_VERSION_COLUMNS)}"
    out.result(rule | {"versions": versions}, human)
    hint(RULE_HINT, out)
    return 0


def reward_rules_versions(client: Client, args: argparse.Namespace, out: Output) -> int:
    rows = first(client.reward_rules.versions(args.rule, limit=page_size(args.limit)), args.limit)
    listed(rows, RULE_VERSION_COLUMNS, out, f"reward rule {args.rule} has no versions")
    hint(RULE_HINT, out)
    return 0


def reward_rules_version(client: Client, args: argparse.Namespace, out: Output) -> int:
    version = client.reward_rules.version(args.rule, args.number)
    spec = json.dumps(version["spec"], indent=2, ensure_ascii=False)
    out.result(version, f"{details(version, skip=('spec',))}\nspec:\n{spec}")
    hint(f"runs launch --reward-rule-version {version['id']}", out)
    return 0


def checkpoints_list(client: Client, args: argparse.Namespace, out: Output) -> int:
    rows = first(client.checkpoints.list(run=args.run, limit=page_size(args.limit)), args.limit)
    return listed(rows, CHECKPOINT_COLUMNS, out, "no checkpoints")


def checkpoints_show(client: Client, args: argparse.Namespace, out: Output) -> int:
    checkpoint = client.checkpoints.get(args.checkpoint)
    out.result(checkpoint, details(checkpoint))
    return 0


def runs_cost(client: Client, args: argparse.Namespace, out: Output) -> int:
    cost = client.costs.of_run(args.run)
    lines = [
        f"run {cost['run']}: {cost['total']} {cost['currency']}, {cost['device_hours']:.4f} device-hours",
        *(
            f"  {kind:<10}  {part['total']} {cost['currency']}  {part['units']['device_seconds']:.1f} "
            f"device-s  {part['units']['tokens_sampled']} tokens sampled"
            for kind, part in cost["by_kind"].items()
        ),
        f"budget: {cost['budget']['money'] or '-'} {cost['currency']}, "
        f"{cost['budget']['device_hours'] or '-'} device-hours",
    ]
    out.result(cost, "\n".join(lines))
    return 0


def runs_show(client: Client, args: argparse.Namespace, out: Output) -> int:
    run = client.runs.get(args.run)
    # The tier's settings at launch and the submitted hyperparameters: `--json` has them; the
    # resolved values say what the run uses.
    human = details(run, skip=("error", "tier_config", "hyperparameters"))
    reason = stop_reason(client, run) if stopped_early(run) else None
    if reason:
        human += f"\nstopped: {reason}"
    out.result(run | {"stop_reason": reason}, human)
    return 0


# --- verifiers environments (flywheel.environments; verifiers in its own virtualenv) ---------------


def sampling_of(args: argparse.Namespace) -> dict[str, Any]:
    sampling: dict[str, Any] = {"max_tokens": args.max_tokens} if args.max_tokens else {}
    return sampling | ({"temperature": args.temperature} if args.temperature is not None else {})


def env_run(client: Client, args: argparse.Namespace, out: Output) -> int:
    loaded = environments.load_environment(args.environment, key_values(args.arg))
    token = args.token or os.environ.get("FLYWHEEL_TOKEN", "")

    def progress(tally: environments.Tally) -> None:
        if not args.json and tally.played % args.every == 0:
            summary = tally.summary()
            print(f"played {summary['played']}: mean reward {summary['reward']:.3f}", file=sys.stderr)

    tally = asyncio.run(
        environments.play_run(
            client,
            loaded,
            args.run,
            token=token,
            concurrency=args.concurrency,
            sampling=sampling_of(args),
            on_played=progress,
        )
    )
    summary = tally.summary() | {"run": args.run, "status": client.runs.get(args.run)["status"]}
    reward = "-" if summary["reward"] is None else f"{summary['reward']:.3f}"
    out.result(
        summary,
        f"run {args.run} {summary['status']}: {tally.played} episodes reported "
        f"(mean reward {reward}), {tally.failed} failed",
    )
    return 0


def env_eval(client: Client, args: argparse.Namespace, out: Output) -> int:
    loaded = environments.load_environment(args.environment, key_values(args.arg))
    items = environments.read_items(args.items, args.split)
    tally = asyncio.run(
        environments.evaluate(
            loaded,
            items,
            base_url=client.url,
            token=args.token or os.environ.get("FLYWHEEL_TOKEN", ""),
            model=args.model,
            concurrency=args.concurrency,
            sampling=sampling_of(args),
            repeats=args.repeats,
        )
    )
    summary = tally.summary() | {"model": args.model, "items": len(items)}
    reward = "-" if summary["reward"] is None else f"{summary['reward']:.3f}"
    components = ", ".join(f"{name} {value:.3f}" for name, value in summary["components"].items())
    out.result(
        summary,
        f"{args.model} on {len(items)} items: mean reward {reward} ({components}); {tally.failed} failed",
    )
    return 0


# --- the parser ----------------------------------------------------------------------------


def common_options(*, root: bool) -> argparse.ArgumentParser:
    """--url, --token and --json, taken before or after the subcommand (as gh and kubectl do);
    after it they are only set when given, so they never undo the same flag given before it."""
    options = argparse.ArgumentParser(add_help=False)
    default: Any = None if root else argparse.SUPPRESS
    options.add_argument(
        "--url", default=default, help="the server (default: FLYWHEEL_URL, else http://127.0.0.1:8000)"
    )
    options.add_argument("--token", default=default, help="an API token (default: FLYWHEEL_TOKEN)")
    options.add_argument(
        "--json",
        action="store_true",
        default=False if root else argparse.SUPPRESS,
        help="print the API's JSON instead of tables and lines",
    )
    return options


class Commands:
    """Adds subcommands that all take the common options and say what each argument is."""

    def __init__(self, parent: argparse.ArgumentParser, dest: str) -> None:
        self.group = parent.add_subparsers(dest=dest, required=True, metavar="COMMAND")
        self.common = common_options(root=False)

    def add(
        self, name: str, help: str, handler: Callable | None = None, **defaults: Any
    ) -> argparse.ArgumentParser:  # noqa: A002
        command = self.group.add_parser(name, help=help, description=help, parents=[self.common])
        if handler is not None:
            command.set_defaults(handler=handler, **defaults)
        return command


def add_limit(command: argparse.ArgumentParser, what: str) -> None:
    command.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_ROWS,
        help=f"show at most this many {what}, newest first (default {DEFAULT_ROWS})",
    )


def add_listing(
    commands: Commands, what: str, handler: Callable, *, filter_name: str | None = None, filter_help: str = ""
) -> argparse.ArgumentParser:
    command = commands.add("list", f"{what}, newest first, as a table (ids in the ID column)", handler)
    if filter_name:
        command.add_argument(f"--{filter_name}", type=int, help=filter_help)
    add_limit(command, what)
    return command


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="flywheel", description="Flywheel from the command line", parents=[common_options(root=True)]
    )
    commands = Commands(root, "command")
    project_help = "only this project's (its id: flywheel projects list)"

    projects = Commands(commands.add("projects", "list and show projects"), "projects_command")
    add_listing(projects, "projects", projects_list)
    projects.add("show", "a project's fields", projects_show).add_argument(
        "project", type=int, help="the project's id"
    )

    task_sets = Commands(
        commands.add("task-sets", "list and show task sets and their versions"), "task_sets_command"
    )
    add_listing(task_sets, "task sets", task_sets_list, filter_name="project", filter_help=project_help)
    show = task_sets.add("show", "a task set and its versions", task_sets_show)
    show.add_argument("task_set", type=int, help="the task set's id")
    add_limit(show, "versions")
    versions = task_sets.add(
        "versions", "a task set's versions: ID is what runs launch takes", task_sets_versions
    )
    versions.add_argument("task_set", type=int, help="the task set's id")
    add_limit(versions, "versions")
    version = task_sets.add("version", "one version of a task set, by its number", task_sets_version)
    version.add_argument("task_set", type=int, help="the task set's id")
    version.add_argument("number", type=int, help="the version's number (1, 2, ...)")

    tiers = Commands(
        commands.add("tiers", "list and show tiers (a model and how it generates)"), "tiers_command"
    )
    add_listing(tiers, "tiers", tiers_list, filter_name="project", filter_help=project_help)
    tiers.add("show", "a tier's settings", tiers_show).add_argument("tier", type=int, help="the tier's id")

    rules = Commands(
        commands.add("reward-rules", "list and show reward rules and their versions"), "rules_command"
    )
    add_listing(rules, "reward rules", reward_rules_list, filter_name="project", filter_help=project_help)
    show = rules.add("show", "a reward rule and its versions", reward_rules_show)
    show.add_argument("rule", type=int, help="the reward rule's id")
    add_limit(show, "versions")
    versions = rules.add(
        "versions", "a reward rule's versions: ID is what runs launch takes", reward_rules_versions
    )
    versions.add_argument("rule", type=int, help="the reward rule's id")
    add_limit(versions, "versions")
    version = rules.add("version", "one version of a reward rule, with its spec", reward_rules_version)
    version.add_argument("rule", type=int, help="the reward rule's id")
    version.add_argument("number", type=int, help="the version's number (1, 2, ...)")

    runs = Commands(
        commands.add("runs", "launch, list, show, follow, pause, resume and cancel runs"), "runs_command"
    )
    launch = runs.add("launch", "launch a run", runs_launch)
    launch.add_argument(
        "--project", type=int, required=True, help="the project's id (flywheel projects list)"
    )
    launch.add_argument("--name", required=True, help="the run's name")
    launch.add_argument(
        "--task-set-version",
        type=int,
        required=True,
        help="the task-set version's id (tasks import prints it; the ID column of flywheel task-sets "
        "versions SET)",
    )
    launch.add_argument(
        "--reward-rule-version",
        type=int,
        required=True,
        help="the reward-rule version's id (the ID column of flywheel reward-rules versions RULE)",
    )
    launch.add_argument("--tier", type=int, required=True, help="the rollout tier's id (flywheel tiers list)")
    launch.add_argument(
        "--method",
        default="grpo",
        help="the training method: grpo (default), sft, dpo, or any algorithm the server registers",
    )
    launch.add_argument("--max-steps", type=int, help="learner steps to train (default: the method's)")
    launch.add_argument("--max-wall-seconds", type=int, help="stop the run after this many seconds")
    launch.add_argument(
        "--priority", type=int, help="a higher priority starts before queued runs of its project"
    )
    launch.add_argument("--budget-money", help="what the run may cost; reaching it pauses the run")
    launch.add_argument(
        "--budget-device-hours", type=float, help="device-hours the run may use before it pauses"
    )
    launch.add_argument(
        "--train-split", choices=("train", "heldout"), help="the items it trains on (default train)"
    )
    launch.add_argument(
        "--eval-split", choices=("train", "heldout"), help="the items it evaluates on (default heldout)"
    )
    launch.add_argument(
        "--hp", action="append", default=[], metavar="NAME=VALUE", help="a hyperparameter (repeat for more)"
    )
    launch.add_argument(
        "--follow", action="store_true", help="follow it to the end, and say why if it stops early"
    )
    listing = add_listing(runs, "runs", runs_list, filter_name="project", filter_help=project_help)
    listing.add_argument(
        "--status", help="only runs in this status (queued, running, succeeded, failed, ...)"
    )
    runs.add("show", "a run's fields, and why it stopped early if it did", runs_show).add_argument(
        "run", type=int, help="the run's id"
    )
    runs.add("cost", "what a run used and cost, by kind, against its budget", runs_cost).add_argument(
        "run", type=int, help="the run's id"
    )
    runs.add("follow", "a run's progress and events until it ends", runs_follow).add_argument(
        "run", type=int, help="the run's id"
    )
    for action in ("pause", "resume", "cancel"):
        runs.add(action, f"{action} a run", runs_action, action=action).add_argument(
            "run", type=int, help="the run's id"
        )

    tasks = Commands(commands.add("tasks", "import task files"), "tasks_command")
    importing = tasks.add(
        "import",
        "import a JSONL or CSV file as a new version; prints the version's id for runs launch",
        tasks_import,
    )
    importing.add_argument("task_set", type=int, help="the task set's id (flywheel task-sets list)")
    importing.add_argument("file", help="the JSONL or CSV file")
    importing.add_argument("--dry-run", action="store_true", help="validate and preview only")
    importing.add_argument(
        "--format",
        default=None,
        help="auto (default; published HumanEval, MBPP, APPS, CodeContests, LiveCodeBench lines are "
        "recognised), jsonl, csv, flywheel, or a published format to force",
    )
    creating = tasks.add(
        "create",
        "create a task set with a JSONL or CSV file as its first version (or, on any error, nothing)",
        tasks_create,
    )
    creating.add_argument("--project", type=int, required=True, help="the project's id")
    creating.add_argument("name", help="the new task set's name")
    creating.add_argument("file", help="the JSONL or CSV file")
    creating.add_argument("--description", default=None, help="what the task set is for")
    creating.add_argument("--dry-run", action="store_true", help="validate and preview only")
    creating.add_argument("--format", default=None, help="as for `tasks import`")

    traces = Commands(commands.add("traces", "report production traces"), "traces_command")
    log = traces.add("log", "report traces from a JSONL file (- for stdin), or one from flags", traces_log)
    log.add_argument("file", nargs="?", help="a JSONL file of traces, one a line (- or nothing: stdin)")
    log.add_argument("--project", type=int, required=True, help="the project's id")
    log.add_argument("--id", help="the trace's id (default: a new one)")
    log.add_argument("--prompt", help="one trace's prompt (instead of a file)")
    log.add_argument("--completion", help="that trace's completion")
    log.add_argument("--model", help="the model that answered")

    checkpoints = Commands(
        commands.add("checkpoints", "list, show and export checkpoints"), "checkpoints_command"
    )
    add_listing(
        checkpoints, "checkpoints", checkpoints_list, filter_name="run", filter_help="only this run's"
    )
    checkpoints.add("show", "a checkpoint's fields and scores", checkpoints_show).add_argument(
        "checkpoint", type=int, help="the checkpoint's id"
    )
    checkpoint_export = checkpoints.add(
        "export",
        "download a checkpoint as a save_pretrained folder with a model card (an archive)",
        checkpoints_export,
    )
    checkpoint_export.add_argument("run", type=int, help="the run's id")
    checkpoint_export.add_argument(
        "step",
        type=int,
        nargs="?",
        help="the checkpoint's step (default: the run's best checkpoint, else its newest)",
    )
    checkpoint_export.add_argument("-o", "--output", help="the archive (default: run-RUN-step-STEP.tar.gz)")
    checkpoint_export.add_argument(
        "--archive", default="tar.gz", choices=("tar.gz", "zip"), help="the archive's format"
    )
    checkpoint_export.add_argument(
        "--weights",
        default="full",
        choices=("full", "adapter"),
        help="full weights, or a LoRA run's adapter alone",
    )

    exporting = commands.add("export", "download reviewed data of a run, or a task-set version", export)
    exporting.add_argument("--run", type=int, help="the run whose reviewed data to export")
    exporting.add_argument(
        "--kind",
        default="sft",
        choices=("sft", "dpo", "dpo-task-set"),
        help="the reviewed data's shape (default sft)",
    )
    exporting.add_argument(
        "--task-set", type=int, help="the task set to export a version of (with --version)"
    )
    exporting.add_argument("--version", type=int, help="the version's number")
    exporting.add_argument("-o", "--output", help="a file (default: stdout)")
    environments = Commands(
        commands.add(
            "env",
            "verifiers environments: play a run's episodes, or score a model on items, with the "
            "environment's rubric (from the verifiers virtualenv: make verifiers-venv)",
        ),
        "env_command",
    )
    env_runs = environments.add(
        "run",
        "play a run of external_rollouts: each episode rolled out by the environment and reported "
        "with its rubric's reward and components, until the run ends",
        env_run,
    )
    env_runs.add_argument("environment", help="a module path or a .py file exposing load_environment()")
    env_runs.add_argument("run", type=int, help="the run's id (its method: external_rollouts)")
    env_runs.add_argument(
        "--every", type=int, default=10, help="print the mean reward every this many episodes (default 10)"
    )
    env_evals = environments.add(
        "eval", "the rubric's mean reward of a model on items (a held-out JSONL file), outside runs", env_eval
    )
    env_evals.add_argument("environment", help="a module path or a .py file exposing load_environment()")
    env_evals.add_argument("--items", required=True, help="a JSONL file of Flywheel items, one a line")
    env_evals.add_argument("--split", help="only the items of this split (an item without one is train's)")
    env_evals.add_argument(
        "--model",
        required=True,
        help="the model on /v1: tier-<id> (the base), run-<id>-step-<n> (a checkpoint), run-<id>",
    )
    env_evals.add_argument(
        "--repeats", type=int, default=1, help="roll each item out this many times (default 1)"
    )
    for command in (env_runs, env_evals):
        command.add_argument(
            "--arg",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="an argument of load_environment (repeat for more)",
        )
        command.add_argument(
            "--concurrency", type=int, default=4, help="rollouts in flight at once (default 4)"
        )
        command.add_argument("--max-tokens", type=int, help="max_tokens of each model call")
        command.add_argument("--temperature", type=float, help="the sampling temperature of each call")
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = Output(args.json)
    try:
        with Client(url=args.url, token=args.token) as client:
            return args.handler(client, args, out)
    except APIError as exc:
        if args.json:
            error = {"status": exc.status, "code": exc.code, "message": exc.message}
            print(json.dumps({"error": error | {"param": exc.param, "details": exc.details}}))
        else:
            print(f"flywheel: {exc.message}", file=sys.stderr)
            for detail in exc.details:
                where = detail.get("param") or ""
                line = f"line {detail['line']}: " if detail.get("line") else ""
                print(f"  {line}{where + ': ' if where else ''}{detail.get('message', '')}", file=sys.stderr)
        return 2
    except (FlywheelError, OSError) as exc:
        print(f"flywheel: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
