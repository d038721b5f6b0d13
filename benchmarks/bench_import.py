"""Benchmark: import 100,000 `answer` items from JSONL (make bench).

Each measurement runs in a fresh process on a fresh database (SQLite under a temporary
FLYWHEEL_HOME unless DATABASE_URL is set), three times; medians are reported. The baseline in
the same run is parsing and validating the same file without storing it, so the ratio shows
what storage costs. Memory: peak RSS growth during the import of 10,000 and of 100,000 items;
a streaming import grows far less than the file does.
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = (10_000, 100_000)
REPEATS = 3


def write_items(path: Path, count: int) -> None:
    with path.open("w") as handle:
        for index in range(count):
            a, b = index % 997, index % 991
            item = {
                "id": f"q{index}",
                "prompt": f"What is {a} + {b}? Answer with a number.",
                "reference": str(a + b),
            }
            handle.write(json.dumps(item) + "\n")


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(mode: str, path: str) -> None:
    """Runs in a fresh process: set up Django, measure one import (or parse), print JSON."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    from projects import services as project_services
    from projects.task_format import read_items
    from runs import services

    call_command("migrate", verbosity=0)
    user = services.User.objects.create_user(username=f"bench-{time.time_ns()}")
    project = project_services.project_create(name=f"bench-{time.time_ns()}", by=user)
    task_set = project_services.task_set_create(project=project, name="bench", by=user)
    before = rss_mb()
    started = time.perf_counter()
    with open(path, "rb") as handle:
        if mode == "parse":
            count = sum(1 for item, errors in read_items(handle, "jsonl") if item is not None)
        else:
            report = project_services.task_set_import(
                task_set=task_set, stream=handle, file_format="jsonl", by=user
            )
            assert report.ok and report.created, report.errors
            count = report.item_count
    seconds = time.perf_counter() - started
    print(
        json.dumps(
            {"items": count, "seconds": seconds, "rss_growth_mb": rss_mb() - before, "peak_rss_mb": rss_mb()}
        )
    )


def measure(mode: str, path: Path) -> dict:
    env = dict(os.environ)
    if "DATABASE_URL" not in env:
        env["FLYWHEEL_HOME"] = tempfile.mkdtemp(prefix="flywheel-bench-")
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(path)],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    from tqdm import tqdm

    results: dict[str, object] = {"benchmark": "task_import_jsonl", "repeats": REPEATS}
    with tempfile.TemporaryDirectory() as folder:
        files = {}
        for size in SIZES:
            files[size] = Path(folder) / f"items-{size}.jsonl"
            write_items(files[size], size)
        runs = [(mode, size) for size in SIZES for mode in ("parse", "import") for _ in range(REPEATS)]
        samples: dict[tuple[str, int], list[dict]] = {}
        for mode, size in tqdm(runs, desc="bench import", unit="run"):
            samples.setdefault((mode, size), []).append(measure(mode, files[size]))
        for size in SIZES:
            imp, parse = samples[("import", size)], samples[("parse", size)]
            import_rate = statistics.median(s["items"] / s["seconds"] for s in imp)
            parse_rate = statistics.median(s["items"] / s["seconds"] for s in parse)
            results[f"n{size}"] = {
                "file_mb": round(files[size].stat().st_size / 2**20, 1),
                "import_items_per_s": round(import_rate),
                "parse_only_items_per_s": round(parse_rate),
                "import_vs_parse_ratio": round(import_rate / parse_rate, 3),
                "import_rss_growth_mb": round(statistics.median(s["rss_growth_mb"] for s in imp), 1),
                "import_peak_rss_mb": round(statistics.median(s["peak_rss_mb"] for s in imp), 1),
            }
    small, large = results[f"n{SIZES[0]}"], results[f"n{SIZES[1]}"]
    results["file_growth_ratio"] = round(large["file_mb"] / small["file_mb"], 1)
    results["rss_growth_ratio"] = round(
        large["import_rss_growth_mb"] / max(small["import_rss_growth_mb"], 0.1), 2
    )
    results["database"] = "postgresql" if "DATABASE_URL" in os.environ else "sqlite-wal"
    print(json.dumps(results))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        main()
