"""Every benchmark, one after another, and `benchmarks/RESULTS.md` written from their JSON lines
(make bench-all).

The benchmarks are the Makefile's `bench*` targets (found there, so a new one is included without
a change here). Each runs as `make <target>`; the last line of its output that parses as a JSON
object is its result. RESULTS.md records, for each, the figures, how long it took, and whether it
failed, under the date, the commit and the machine, so the README's figures can always point at
the last measured ones. `BENCH_ONLY=bench-api,bench-traces` runs a subset and keeps the other
rows of the existing file. Ends with one line of JSON: every target's status and seconds.
"""

import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
TARGET = re.compile(r"^(bench(?:-[a-z0-9-]+)?):", re.MULTILINE)
ROW = re.compile(r"^\| `make (bench[a-z0-9-]*)` \|.*$", re.MULTILINE)


@dataclass
class Outcome:
    target: str
    seconds: float
    figures: dict | None
    error: str = ""


def targets() -> list[str]:
    found = TARGET.findall((ROOT / "Makefile").read_text())
    return [name for name in found if name != "bench-all"]


def last_json_object(output: str) -> dict | None:
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def run(target: str) -> Outcome:
    print(f"=== make {target}", file=sys.stderr, flush=True)
    started = time.monotonic()
    done = subprocess.run(["make", "--no-print-directory", target], cwd=ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - started
    sys.stderr.write(done.stderr[-4000:])
    figures = last_json_object(done.stdout)
    if done.returncode != 0 or figures is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return Outcome(target, seconds, figures, f"exit {done.returncode}: {tail[0][:200]}")
    return Outcome(target, seconds, figures)


def row(outcome: Outcome) -> str:
    if outcome.error:
        figures = f"**failed** ({outcome.error})"
    else:
        figures = ", ".join(f"{key}: {value}" for key, value in outcome.figures.items())
    return f"| `make {outcome.target}` | {outcome.seconds:.0f} s | {figures.replace('|', '/')} |"


def machine() -> str:
    try:
        import torch  # the benchmarks' own dependency; only its device is read

        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except ImportError:
        device = "torch not installed"
    return f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, {device}"


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def write(outcomes: list[Outcome], kept: dict[str, str]) -> None:
    rows = kept | {outcome.target: row(outcome) for outcome in outcomes}
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = [
        "# Benchmark results",
        "",
        f"Written by `make bench-all` on {now}, commit {commit()}, on {machine()}.",
        "Each row is the last line of JSON its benchmark printed (the README's Benchmarks section says",
        "what each compares). With `BENCH_ONLY`, the rows of the benchmarks not run are kept from the",
        "previous file: they were measured at an earlier commit.",
        "",
        "| command | took | figures |",
        "| --- | --- | --- |",
        *(rows[name] for name in sorted(rows)),
        "",
    ]
    RESULTS.write_text("\n".join(text))


def main() -> None:
    chosen = targets()
    if only := os.environ.get("BENCH_ONLY"):
        wanted = {name.strip() for name in only.split(",")}
        unknown = wanted - set(chosen)
        if unknown:
            raise SystemExit(f"BENCH_ONLY names no benchmark target: {', '.join(sorted(unknown))}")
        chosen = [name for name in chosen if name in wanted]
    kept = _rows(RESULTS.read_text()) if RESULTS.exists() else {}
    outcomes = [run(target) for target in chosen]
    write(outcomes, {name: text for name, text in kept.items() if name not in chosen})
    summary = {o.target: {"ok": not o.error, "seconds": round(o.seconds)} for o in outcomes}
    print(json.dumps({"bench": "all", "results": str(RESULTS.relative_to(ROOT)), **summary}))
    if any(o.error for o in outcomes):
        raise SystemExit(1)


def _rows(text: str) -> dict[str, str]:
    return {match.group(1): match.group(0) for match in ROW.finditer(text)}


if __name__ == "__main__":
    main()
