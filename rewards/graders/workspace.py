"""What a sample wrote and which of an item's files are tests: shared by the graders and the detectors."""

import posixpath
import re
import shlex

from rewards.graders.base import Sample

TEST_FILE = "test_solution.py"  # where unit_tests puts a code item's tests
SOLUTION_FILE = "solution.py"  # the module a code item's tests import
TEST_NAME = re.compile(r"(^|/)(test_[^/]*\.py|[^/]*_test\.py|conftest\.py|tests?/.*)$")
STARTUP_FILE = re.compile(r"(^|/)(sitecustomize\.py|usercustomize\.py|[^/]*\.pth)$")
FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def solution_source(sample: Sample, path: str = SOLUTION_FILE) -> str:
    """The solution: the file the model wrote, else the last fenced Python block of its text, else the text.

    >>> solution_source(Sample(output_text="Here:\\n```python\\ndef f():\\n    return 1\\n```\\n"))
    'def f():\\n    return 1\\n'
    """
    if path in sample.files:
        return sample.files[path]
    blocks = FENCE.findall(sample.output_text)
    return blocks[-1] if blocks else sample.output_text


def protected_files(item: dict) -> dict[str, str]:
    """The item's test and check files, path -> pristine content ("" where only the name is known).

    >>> sorted(protected_files({"kind": "agent", "check_command": "python -m pytest tests/test_app.py",
    ...     "files": {"app.py": "", "tests/test_app.py": "def test(): ..."}}))
    ['tests/test_app.py']
    """
    files = dict(item.get("setup_files") or item.get("files") or {})
    protected = {path: content for path, content in files.items() if TEST_NAME.search(path)}
    if item.get("kind") == "code" and "tests" in item:
        protected[TEST_FILE] = item["tests"]
    for word in command_words(item.get("check_command") or ""):
        normal = posixpath.normpath(word)
        if normal in files:
            protected[normal] = files[normal]
        elif TEST_NAME.search(normal) and "." in posixpath.basename(normal):
            protected.setdefault(normal, "")
    return protected


def command_words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()
