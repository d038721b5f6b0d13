"""Static files as `make up` serves them: collected when one changed, fingerprinted, compressed,
and linked under the plain names before any collection (tests/test_ui_shell_browser.py measures the
run page over the wire)."""

import json
from pathlib import Path

from django.contrib.staticfiles.storage import staticfiles_storage
from django.core.management import call_command

from webapp.static_storage import static_collect_if_changed


def collected(root: Path) -> dict[str, str]:
    return json.loads((root / "staticfiles.json").read_text())["paths"]


def test_static_files_are_collected_again_only_when_one_changed(settings, tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    (source / "app.js").write_text("console.log('one');\n" * 50)
    settings.STATICFILES_DIRS = [source]
    settings.STATICFILES_FINDERS = ["django.contrib.staticfiles.finders.FileSystemFinder"]
    settings.STATIC_ROOT = str(tmp_path / "root")
    root = Path(settings.STATIC_ROOT)

    assert static_collect_if_changed() is True
    first = collected(root)["app.js"]
    assert first.startswith("app.") and first != "app.js"
    assert {path.name for path in root.glob("app.*")} >= {first, f"{first}.gz", f"{first}.br"}
    assert static_collect_if_changed() is False

    (source / "app.js").write_text("console.log('two');\n" * 50)
    assert static_collect_if_changed() is True
    assert collected(root)["app.js"] != first


def test_pages_link_the_fingerprinted_name_once_collected_and_the_plain_one_before(settings, tmp_path):
    settings.STATIC_ROOT = str(tmp_path / "root")
    assert staticfiles_storage.url("flywheel.css") == "/static/flywheel.css"
    call_command(
        "collectstatic", interactive=False, verbosity=0, ignore_patterns=["admin", "drf_*", "rest_*"]
    )
    settings.STATIC_ROOT = str(tmp_path / "root")  # a fresh storage, as a restarted server reads it
    assert (
        staticfiles_storage.url("flywheel.css") == f"/static/{collected(tmp_path / 'root')['flywheel.css']}"
    )
