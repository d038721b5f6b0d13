"""Static files under fingerprinted names, compressed, once `collectstatic` has run (`make up`)."""

import hashlib
import os
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from whitenoise.storage import CompressedManifestStaticFilesStorage


class FingerprintedStaticStorage(CompressedManifestStaticFilesStorage):
    """Whitenoise's storage: `collectstatic` writes each file under a name with its content's hash,
    gzip and brotli copies beside it, and a manifest; whitenoise serves the copy the browser asks
    for, and the hashed names cached for a year (immutable).

    Before any `collectstatic` (a fresh checkout's tests, `runserver`) there is no manifest: pages
    then link the plain names, which whitenoise serves from static/ through the finders. Once a
    manifest exists, a name missing from it is an error, as in Django's own storage."""

    def stored_name(self, name: str) -> str:
        if not self.hashed_files:
            return name
        return super().stored_name(name)


def static_sources_digest() -> str:
    """A digest of every static file the finders see (name, size, modification time)."""
    from django.contrib.staticfiles import finders

    digest = hashlib.sha256()
    for finder in finders.get_finders():
        for path, storage in sorted(finder.list([]), key=lambda found: found[0]):
            stat = os.stat(storage.path(path))
            digest.update(
                f"{getattr(storage, 'prefix', '') or ''}/{path} {stat.st_size} {stat.st_mtime_ns}\n".encode()
            )
    return digest.hexdigest()


def static_collect_if_changed() -> bool:
    """`collectstatic` when a static file changed since the last one (`make up`): compressing
    every file again takes a minute on a busy machine. Returns whether it ran."""
    marker = Path(settings.STATIC_ROOT) / ".sources"
    digest = static_sources_digest()
    if marker.exists() and marker.read_text() == digest and (marker.parent / "staticfiles.json").exists():
        return False
    call_command("collectstatic", interactive=False, verbosity=0)
    marker.write_text(digest)
    return True
