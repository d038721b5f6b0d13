"""The `flywheel` command: runs (launch, list, follow, pause, resume, cancel), task imports, trace
logging and exports, with progress bars on stderr and `--json` for machine-readable output.

Configuration as the client's: --url / FLYWHEEL_URL, --token / FLYWHEEL_TOKEN."""

import argparse
import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from flywheel.client import Client
from flywheel.errors import APIError, FlywheelError

TERMINAL = ("succeeded", "failed", "cancelled")
TRACE_BATCH = 100


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


def run_line(run: dict) -> str:
    progress = run.get("progress") or {}
    step = f"{progress.get('learner_step', 0)}/{progress.get('max_steps', '?')}"
    return f"{run['id']:>6}  {run['status']:<10}  {run['method']:<4}  step {step:<9}  {run['name']}"


# --- runs ----------------------------------------------------------------------------------


def runs_launch(client: Client, args: argparse.Namespace, out: Output) -> int:
    options = {
        name: getattr(args, name)
        for name in ("max_wall_seconds", "priority", "train_split", "eval_split")
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
    runs = []
    for run in client.runs.list(project=args.project, status=args.status):
        runs.append(run)
        if len(runs) >= args.limit:
            break
    out.result(runs, "\n".join(run_line(run) for run in runs) or "no runs")
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
    out.result({"run": run, "events": events}, run_line(run))
    return 0 if run.get("status") == "succeeded" else 1


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
    what = "would import" if args.dry_run else "imported"
    number = f" as version {version.get('number')}" if version.get("number") else ""
    out.result(version, f"{what} {version.get('item_count')} items{number}")
    return 0


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
        out.result(created, f"created task set {created.get('id')} with {version.get('item_count')} items")
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


# --- the parser ----------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="flywheel", description="Flywheel from the command line")
    root.add_argument("--url", help="the server (default: FLYWHEEL_URL, else http://127.0.0.1:8000)")
    root.add_argument("--token", help="an API token (default: FLYWHEEL_TOKEN)")
    root.add_argument("--json", action="store_true", help="print JSON instead of lines")
    commands = root.add_subparsers(dest="command", required=True)

    runs = commands.add_parser("runs", help="launch, list, follow, pause, resume and cancel runs")
    run_commands = runs.add_subparsers(dest="runs_command", required=True)
    launch = run_commands.add_parser("launch", help="launch a run")
    launch.add_argument("--project", type=int, required=True)
    launch.add_argument("--name", required=True)
    launch.add_argument("--task-set-version", type=int, required=True)
    launch.add_argument("--reward-rule-version", type=int, required=True)
    launch.add_argument("--tier", type=int, required=True)
    launch.add_argument("--method", default="grpo", choices=("grpo", "sft", "dpo"))
    launch.add_argument("--max-steps", type=int)
    launch.add_argument("--max-wall-seconds", type=int)
    launch.add_argument("--priority", type=int)
    launch.add_argument("--train-split", choices=("train", "heldout"))
    launch.add_argument("--eval-split", choices=("train", "heldout"))
    launch.add_argument("--hp", action="append", default=[], metavar="NAME=VALUE", help="a hyperparameter")
    launch.add_argument("--follow", action="store_true", help="follow it to the end")
    launch.set_defaults(handler=runs_launch)
    listing = run_commands.add_parser("list", help="runs, newest first")
    listing.add_argument("--project", type=int)
    listing.add_argument("--status")
    listing.add_argument("--limit", type=int, default=20)
    listing.set_defaults(handler=runs_list)
    follow = run_commands.add_parser("follow", help="a run's progress and events until it ends")
    follow.add_argument("run", type=int)
    follow.set_defaults(handler=runs_follow)
    for action in ("pause", "resume", "cancel"):
        command = run_commands.add_parser(action, help=f"{action} a run")
        command.add_argument("run", type=int)
        command.set_defaults(handler=runs_action, action=action)

    tasks = commands.add_parser("tasks", help="import task files")
    task_commands = tasks.add_subparsers(dest="tasks_command", required=True)
    importing = task_commands.add_parser("import", help="import a JSONL or CSV file as a new version")
    importing.add_argument("task_set", type=int)
    importing.add_argument("file")
    importing.add_argument("--dry-run", action="store_true", help="validate and preview only")
    importing.add_argument(
        "--format",
        default=None,
        help="auto (default; published HumanEval, MBPP, APPS, CodeContests, LiveCodeBench lines are "
        "recognised), jsonl, csv, flywheel, or a published format to force",
    )
    importing.set_defaults(handler=tasks_import)
    creating = task_commands.add_parser(
        "create",
        help="create a task set with a JSONL or CSV file as its first version (or, on any error, nothing)",
    )
    creating.add_argument("--project", type=int, required=True)
    creating.add_argument("name")
    creating.add_argument("file")
    creating.add_argument("--description", default=None)
    creating.add_argument("--dry-run", action="store_true", help="validate and preview only")
    creating.add_argument("--format", default=None, help="as for `tasks import`")
    creating.set_defaults(handler=tasks_create)

    traces = commands.add_parser("traces", help="report production traces")
    trace_commands = traces.add_subparsers(dest="traces_command", required=True)
    log = trace_commands.add_parser(
        "log", help="report traces from a JSONL file (- for stdin), or one from flags"
    )
    log.add_argument("file", nargs="?")
    log.add_argument("--project", type=int, required=True)
    log.add_argument("--id")
    log.add_argument("--prompt")
    log.add_argument("--completion")
    log.add_argument("--model")
    log.set_defaults(handler=traces_log)

    checkpoints = commands.add_parser("checkpoints", help="export checkpoints")
    checkpoint_commands = checkpoints.add_subparsers(dest="checkpoints_command", required=True)
    checkpoint_export = checkpoint_commands.add_parser(
        "export", help="download a checkpoint as a save_pretrained folder with a model card (an archive)"
    )
    checkpoint_export.add_argument("run", type=int)
    checkpoint_export.add_argument(
        "step", type=int, nargs="?", help="default: the run's best checkpoint (else its newest)"
    )
    checkpoint_export.add_argument("-o", "--output", help="the archive (default: run-RUN-step-STEP.tar.gz)")
    checkpoint_export.add_argument("--archive", default="tar.gz", choices=("tar.gz", "zip"))
    checkpoint_export.add_argument("--weights", default="full", choices=("full", "adapter"))
    checkpoint_export.set_defaults(handler=checkpoints_export)

    exporting = commands.add_parser("export", help="download reviewed data of a run, or a task-set version")
    exporting.add_argument("--run", type=int)
    exporting.add_argument("--kind", default="sft", choices=("sft", "dpo", "dpo-task-set"))
    exporting.add_argument("--task-set", type=int)
    exporting.add_argument("--version", type=int)
    exporting.add_argument("-o", "--output", help="a file (default: stdout)")
    exporting.set_defaults(handler=export)
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
