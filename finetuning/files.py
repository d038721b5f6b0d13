"""Files of OpenAI's fine-tuning API: kept byte for byte once every line is a line of its format
(`finetuning.formats`); what goes wrong is an `ApiError` naming the line and the field."""

from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.files.base import ContentFile

from core import strict_json
from core.roles import Permission
from finetuning import formats
from finetuning.errors import ApiError
from finetuning.models import FineTuningFile
from projects import selectors as project_selectors
from projects.models import Project

MAX_ERRORS_SHOWN = 5


def file_upload(*, project: Project, by: User, upload: Any, purpose: Any) -> FineTuningFile:
    """Keep an uploaded JSONL file byte for byte, once every line is a line of its format."""
    project_selectors.require(user=by, project_id=project.pk, permission=Permission.EDIT)
    if purpose != FineTuningFile.Purpose.FINE_TUNE:
        raise ApiError(
            400,
            f"purpose must be 'fine-tune' here (Flywheel keeps fine-tuning files only); got {purpose!r}",
            "purpose",
            "invalid_value",
        )
    if upload is None:
        raise ApiError(
            400, "send the file as the multipart field 'file'", "file", "missing_required_parameter"
        )
    limit = settings.FLYWHEEL_MAX_UPLOAD_MB * 1024 * 1024
    if upload.size > limit:
        raise ApiError(
            400, f"the file is {upload.size} bytes; at most {limit} here", "file", "file_too_large"
        )
    content = upload.read()
    lines = decoded_lines(content)
    first = next((raw for _, raw in lines), None)
    if first is None:
        raise ApiError(400, "the file holds no lines", "file", "invalid_file_format")
    line_format = formats.line_format(first)
    # At upload the method is not known yet: a chat line is checked as a chat line, and again
    # against its job's method when a job uses it.
    method = formats.DPO if line_format == formats.PREFERENCE else formats.CHAT
    refuse_problems([p for number, raw in lines for p in formats.line_problems(number, raw, method)], "file")
    stored = FineTuningFile(
        project=project,
        filename=(upload.name or "file.jsonl")[:255],
        purpose=purpose,
        bytes=len(content),
        line_format=line_format,
        created_by_id=by.pk,
    )
    stored.content.save(f"{stored.id}.jsonl", ContentFile(content), save=False)
    stored.save()
    return stored


def decoded_lines(content: bytes) -> list[tuple[int, Any]]:
    """(line number, object) for each non-blank line; the first undecodable line is refused."""
    out = []
    for number, raw_line in enumerate(content.split(b"\n"), start=1):
        if not raw_line.strip():
            continue
        try:
            out.append((number, strict_json.loads(raw_line.decode("utf-8-sig" if number == 1 else "utf-8"))))
        except UnicodeDecodeError as exc:
            raise ApiError(
                400, f"line {number}: not UTF-8 text ({exc.reason})", "file", "invalid_file_format"
            ) from None
        except (strict_json.JsonInputError, ValueError) as exc:
            raise ApiError(400, f"line {number}: not JSON ({exc})", "file", "invalid_file_format") from None
    return out


def refuse_problems(problems: list[formats.LineError], param: str) -> None:
    if not problems:
        return
    shown = "; ".join(str(problem) for problem in problems[:MAX_ERRORS_SHOWN])
    more = f"; and {len(problems) - MAX_ERRORS_SHOWN} more" if len(problems) > MAX_ERRORS_SHOWN else ""
    raise ApiError(
        400, f"{len(problems)} problem(s) in the file: {shown}{more}", param, "invalid_file_format"
    )


def file_delete(*, file: FineTuningFile, by: User) -> None:
    project_selectors.require(user=by, project_id=file.project_id, permission=Permission.EDIT)
    file.content.delete(save=False)
    file.delete()


def file_bytes(file: FineTuningFile) -> bytes:
    with file.content.open("rb") as handle:
        return handle.read()
