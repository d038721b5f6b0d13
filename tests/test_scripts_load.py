"""Every command-line script loads as `python scripts/x.py` runs it: from any directory, with only
its own folder on sys.path, before Django is set up.

A module-level import of a project package in a script fails only when the script is run (CI's
`make fuzz` broke that way once), so each script's top level is executed here, in a process of its
own, under a name that skips its `main()`.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted([*ROOT.glob("scripts/*.py"), *ROOT.glob("benchmarks/*.py")])

LOAD = """
import runpy, sys
path = sys.argv[1]
sys.path[0] = path.rsplit("/", 1)[0]
runpy.run_path(path, run_name="flywheel_load_check")
"""


@pytest.mark.backend_independent
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_script_top_level_loads_as_run(script: Path, tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "FLYWHEEL_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
