"""The refusal of OpenAI's fine-tuning API: a status, a message, the parameter at fault and a code."""


class ApiError(Exception):
    """A refusal in OpenAI's terms: status, message, the parameter at fault and a code."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str = "invalid_request"
    ) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code
