"""A completion as a trajectory step keeps it. Torch-free (the web process records an external
agent's turns with it without importing the decoder)."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference.generation import Completion


def completion_record(prompt: str, completion: "Completion") -> dict:
    """The prompt, the text, the exact prompt and completion token ids and the behaviour log-probs
    the learner trains on."""
    record: dict[str, Any] = {
        "prompt": prompt,
        "completion": completion.text,
        "prompt_token_ids": completion.prompt_token_ids,
        "token_ids": completion.token_ids,
        "logprobs": completion.logprobs,
        "finish_reason": completion.finish_reason,
    }
    if completion.served_by:  # an engine tier's: which model or adapter the engine served
        record["served_by"] = completion.served_by
    if completion.device_class:  # served on /v1: its share of the decode's device time (costs/)
        record["device_seconds"] = completion.device_seconds
        record["device_class"] = completion.device_class
    return record
