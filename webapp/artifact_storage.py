"""How the artifact storage is configured (STORAGES["artifacts"]; runs/artifacts.py uses it).
Imported by the settings: no Django here."""


def folder_storage(location: str) -> dict:
    """A folder: FLYWHEEL_HOME/artifacts by default, on many hosts a mount they all share."""
    return {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": location}}


def s3_storage(*, bucket: str, endpoint: str = "") -> dict:
    """An S3-compatible bucket through django-storages (credentials: boto3's usual AWS_* variables
    or instance role); `endpoint` for a store other than AWS (MinIO, Ceph RGW, R2). Artifacts are
    written once under names that never repeat, so a rewrite may overwrite in place."""
    return {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": bucket,
            "endpoint_url": endpoint or None,
            "location": "flywheel",
            "file_overwrite": True,
        },
    }
