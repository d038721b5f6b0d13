"""The documentation (the README and the site's pages under docs/) names every setting, make target and
management command (as datasette does), and the README's links lead to files that exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
# The documentation as a whole: the README and the site's pages (docs/), where each thing has a home.
DOCS = "\n".join([README, *(path.read_text() for path in sorted((ROOT / "docs").rglob("*.md")))])


def settings_read_from_environment() -> set[str]:
    source = (ROOT / "webapp" / "settings.py").read_text()
    names = set(re.findall(r'env_(?:str|int|bool|list)\(\s*"([A-Z0-9_]+)"', source))
    names |= set(re.findall(r'os\.environ(?:\.get)?\(\s*"([A-Z0-9_]+)"', source))
    names |= set(re.findall(r'"([A-Z0-9_]+)" (?:not )?in os\.environ', source))
    return names


def make_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.MULTILINE)
    return set(phony.group(1).split())


def management_commands() -> set[str]:
    return {path.stem for path in ROOT.glob("*/management/commands/*.py") if not path.stem.startswith("_")}


def test_every_setting_is_documented():
    names = settings_read_from_environment()
    assert {"DATABASE_URL", "REDIS_URL", "FLYWHEEL_HOME", "PORT"} <= names
    assert sorted(name for name in names if f"`{name}`" not in DOCS) == []


def test_every_make_target_is_documented():
    targets = make_targets()
    assert {"up", "down", "test", "bench"} <= targets
    assert sorted(target for target in targets if f"`make {target}`" not in DOCS) == []


def test_every_management_command_is_documented():
    commands = management_commands()
    assert "create_api_token" in commands
    undocumented = [c for c in commands if not re.search(rf"`python manage\.py {c}\b", DOCS)]
    assert sorted(undocumented) == []


def test_the_quick_start_is_exactly_the_two_commands():
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^\s*(make \w+)\s*$", quick_start, re.MULTILINE)
    assert commands[:2] == ["make up", "make test"]


def test_the_readme_links_only_to_files_that_exist():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert len(links) >= 20
    assert sorted(link for link in links if not (ROOT / link).is_file()) == []


def test_the_architecture_page_names_every_package():
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    assert {"runs", "webapp", "workers", "sandboxes"} <= packages
    assert sorted(name for name in packages if f"`{name}/`" not in architecture) == []
