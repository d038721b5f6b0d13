"""The agent's tools: what each built-in (schemas in `inference.tool_chat`) does in the
episode's sandbox, with the record a trajectory step keeps of it (output, per-test results, the
workspace diff).

Built-ins: `shell`, `read_file`, `write_file`, `run_tests`, `submit`. An item may restrict the set
with `tools` (a list of their names). Model output is untrusted: it runs only inside the sandbox.
"""

import difflib
from dataclasses import dataclass, field

from inference.tool_chat import BUILTIN_TOOLS, SUBMIT, ToolCall, item_tools, tools_problem
from rewards.graders.workspace import protected_files
from sandboxes.interface import InfrastructureError, SandboxError, StopReason

OUTPUT_CHARS = 1200  # of a tool's output, in the conversation the policy sees (head and tail kept)
RECORD_CHARS = 8000  # of a tool's output, in the trajectory's record
READ_BYTES = 64_000  # read_file's cap
# The final workspace a trajectory keeps, and the snapshots diffs are taken from: at most this.
WORKSPACE_FILES = 100
WORKSPACE_FILE_BYTES = 100_000
WORKSPACE_BYTES = 500_000
SKIPPED = ("__pycache__/", ".pytest_cache/")


def truncated(text: str, limit: int = OUTPUT_CHARS) -> tuple[str, int]:
    """The text cut to about `limit` characters, head and tail kept around a marker; and how many
    characters were cut (0: none).

    >>> truncated("a" * 10 + "b" * 10, 12)
    ('aaaaaaaa\\n[... 8 characters truncated ...]\\nbbbb', 8)
    """
    if len(text) <= limit:
        return text, 0
    head, tail = limit * 2 // 3, limit // 3
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters truncated ...]\n{text[len(text) - tail :]}", cut


@dataclass
class Workspace:
    """A bounded snapshot of the workspace: text of each file, and what the bound left out."""

    files: dict[str, str] = field(default_factory=dict)
    omitted: list[str] = field(default_factory=list)

    def record(self) -> dict:
        return {
            "files": dict(self.files),
            "omitted": list(self.omitted),
            "bound": {
                "files": WORKSPACE_FILES,
                "file_bytes": WORKSPACE_FILE_BYTES,
                "total_bytes": WORKSPACE_BYTES,
            },
        }


def workspace_initial(item: dict) -> Workspace:
    return Workspace(files=dict(item.get("files") or {}))


def workspace_read(sandbox) -> Workspace:
    """The workspace's regular files (caches skipped), within the bound; the rest are `omitted`."""
    workspace, total = Workspace(), 0
    for entry in sandbox.list_files(max_entries=WORKSPACE_FILES * 4):
        if entry.kind != "file" or any(part in entry.path + "/" for part in SKIPPED):
            continue
        fits = len(workspace.files) < WORKSPACE_FILES and entry.size <= WORKSPACE_FILE_BYTES
        if not fits or total + entry.size > WORKSPACE_BYTES:
            workspace.omitted.append(entry.path)
            continue
        data = sandbox.read_file(entry.path, max_bytes=WORKSPACE_FILE_BYTES)
        workspace.files[entry.path] = data.decode("utf-8", errors="replace")
        total += len(data)
    return workspace


def workspace_diff(before: Workspace, after: Workspace) -> list[dict]:
    """Each changed file: path, status (added, modified, deleted) and a unified diff.

    >>> workspace_diff(Workspace({"a.py": "x = 1\\n"}), Workspace({"a.py": "x = 2\\n"}))[0]["diff"]
    '--- a/a.py\\n+++ b/a.py\\n@@ -1 +1 @@\\n-x = 1\\n+x = 2\\n'
    """
    changes = []
    for path in sorted(set(before.files) | set(after.files)):
        old, new = before.files.get(path), after.files.get(path)
        if old == new:
            continue
        status = "added" if old is None else "deleted" if new is None else "modified"
        lines = difflib.unified_diff(
            (old or "").splitlines(keepends=True),
            (new or "").splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
        text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
        changes.append({"path": path, "status": status, "diff": truncated(text, RECORD_CHARS)[0]})
    return changes


@dataclass
class ToolOutcome:
    """What a call did: the text the policy is answered with, and the record the step keeps."""

    output: str
    record: dict
    mutates: bool = False  # the workspace may have changed: take a diff


def tool_run(call: ToolCall, sandbox, item: dict, seconds: float) -> ToolOutcome:
    """Run one valid call in the sandbox. An InfrastructureError propagates (the episode errors);
    any other refusal (a path outside the workspace, no such file) is the call's own result."""
    try:
        return RUNNERS[call.name](call.arguments, sandbox, item, seconds)
    except InfrastructureError:
        raise
    except (SandboxError, OSError, ValueError) as exc:
        message = f"error: {exc}"
        return ToolOutcome(message, {"error": message[:RECORD_CHARS]})


def _shell(arguments: dict, sandbox, item: dict, seconds: float) -> ToolOutcome:
    result = sandbox.exec(arguments["command"])  # the item's wall_seconds if it asks, else the default
    output = result.stdout + result.stderr
    if result.stop_reason != StopReason.EXITED:
        output += f"\n[stopped: {result.stop_reason}]"
    record = {
        "exit_code": result.exit_code,
        "stop_reason": str(result.stop_reason),
        "stdout": result.stdout[:RECORD_CHARS],
        "stderr": result.stderr[:RECORD_CHARS],
        "wall_seconds": round(result.wall_seconds, 4),
        "cpu_seconds": round(result.cpu_seconds, 4),
    }
    return ToolOutcome(f"exit {result.exit_code}\n{output}", record, mutates=True)


def _read_file(arguments: dict, sandbox, item: dict, seconds: float) -> ToolOutcome:
    try:
        data = sandbox.read_file(arguments["path"], max_bytes=READ_BYTES)
    except FileNotFoundError:
        message = f"error: no such file: {arguments['path']}"
        return ToolOutcome(message, {"error": message[:RECORD_CHARS]})
    text = data.decode("utf-8", errors="replace")
    return ToolOutcome(text, {"path": arguments["path"], "bytes": len(data), "stdout": text[:RECORD_CHARS]})


def _write_file(arguments: dict, sandbox, item: dict, seconds: float) -> ToolOutcome:
    content = arguments["content"]
    sandbox.write_file(arguments["path"], content)
    size = len(content.encode())
    return ToolOutcome(
        f"wrote {size} bytes to {arguments['path']}", {"path": arguments["path"], "bytes": size}, mutates=True
    )


def tests_path(item: dict) -> str | None:
    """The test file run_tests runs when the call names none: the item's `test_file`, else the
    first test file among its files (or named by its check command)."""
    if item.get("test_file"):
        return item["test_file"]
    files = item.get("files") or {}
    candidates = [path for path in protected_files(item) if path in files and path.endswith(".py")]
    return candidates[0] if candidates else None


def _run_tests(arguments: dict, sandbox, item: dict, seconds: float) -> ToolOutcome:
    path = arguments.get("path") or tests_path(item)
    if path is None:
        message = "error: this task has no test file; name one with path"
        return ToolOutcome(message, {"error": message})
    result = sandbox.run_tests(path)  # the pristine tests, never a copy the agent rewrote
    tests = [
        {
            "name": test.name,
            "status": str(test.outcome),
            "passed": str(test.outcome) == "pass",
            "message": test.message[:500],
            "seconds": round(test.duration, 4),
        }
        for test in result.tests
    ]
    passed = sum(test["passed"] for test in tests)
    lines = [f"{passed} passed, {len(tests) - passed} failed"] + [
        f"{test['status'].upper()} {test['name']}: {test['message']}".rstrip(": ")
        for test in tests
        if not test["passed"]
    ]
    record = {
        "path": path,
        "exit_code": result.execution.exit_code,
        "tests": tests,
        "passed": passed,
        "failed": len(tests) - passed,
        "stdout": "\n".join(lines),
    }
    return ToolOutcome("\n".join(lines), record)


def _submit(arguments: dict, sandbox, item: dict, seconds: float) -> ToolOutcome:
    return ToolOutcome("submitted", {"submitted": True})


RUNNERS = {
    "shell": _shell,
    "read_file": _read_file,
    "write_file": _write_file,
    "run_tests": _run_tests,
    "submit": _submit,
}


__all__ = ["BUILTIN_TOOLS", "SUBMIT", "item_tools", "tools_problem", "tool_run", "truncated"]
