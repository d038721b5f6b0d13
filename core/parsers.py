"""The REST API's JSON parser. Kept apart from core.api because DRF imports parser classes
while its own views module is still loading."""

from typing import Any

from django.conf import settings
from rest_framework import exceptions
from rest_framework.parsers import JSONParser

from core import strict_json


class StrictJSONParser(JSONParser):
    """JSON bodies through core.strict_json: NaN, overflowing numbers and nesting deeper than
    strict_json.MAX_DEPTH answer 400 instead of reaching (and crashing) the code behind."""

    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        raw = stream.read() if stream is not None else b""
        try:
            return strict_json.loads(raw.decode(encoding))
        except UnicodeDecodeError as exc:
            raise exceptions.ParseError(
                f"JSON parse error - the body is not {encoding} text: {exc.reason}"
            ) from None
        except strict_json.JsonInputError as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
