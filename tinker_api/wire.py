"""The Tinker SDK's binary messages, read and written with the pinned SDK's own schema.

The official `tinker` client sends `forward_backward` as protobuf and reads `ForwardBackwardOutput`
and `SampleResponse` only as protobuf. The schema is the SDK's compiled module
(`tinker/proto/tinker_public_pb2.py`); it is loaded from its file, not through `import tinker`,
whose package imports torch: the web process decodes and encodes with protobuf and numpy alone.

Torch-free and Django-free: the web process parses requests with it, the learner and the rollout
workers write answers with it.
"""

import importlib.util
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

PROTO_CONTENT_TYPE = "application/x-protobuf"
# The losses the SDK names and this server computes (workers/learners/tinker.py), with the
# inputs each needs besides `target_tokens`.
LOSS_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
    "dro": ("logprobs", "advantages"),
}
REFUSED_LOSSES = {
    "gspo": "gspo is not served here yet; use ppo or cispo (token-level clipping)",
    "stable_reinforce": "stable_reinforce needs the sampler's stability records; this server keeps none",
    "custom": "custom losses run in your process: use forward_backward_custom, which calls forward",
}


class WireError(ValueError):
    """A message that cannot be read; the text says which field of which datum."""


@cache
def schema() -> ModuleType:
    """The SDK's `tinker_public_pb2`, loaded from its file (see the module's docstring)."""
    spec = importlib.util.find_spec("tinker")
    if spec is None or not spec.submodule_search_locations:
        raise WireError("the tinker package is not installed; the Tinker API needs tinker==0.38.0")
    path = Path(next(iter(spec.submodule_search_locations))) / "proto" / "tinker_public_pb2.py"
    module_spec = importlib.util.spec_from_file_location("flywheel_tinker_public_pb2", path)
    if module_spec is None or module_spec.loader is None:
        raise WireError(f"cannot load the Tinker wire schema from {path}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@dataclass
class Datum:
    """One sequence: its input tokens and the loss's inputs, each a flat list aligned to them."""

    tokens: list[int]
    inputs: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class ForwardBackward:
    model_id: str
    seq_id: int
    loss_fn: str
    forward_only: bool
    config: dict[str, float | str]
    data: list[Datum]


def _tensor(message: Any, where: str) -> list[float]:
    """One value per input token. The SDK writes float32 and int64 (ints also as int32); a sparse
    tensor is 2-D (the SDK sparsifies only 2-D inputs), and 2-D inputs are not served."""
    pb = schema()
    dtype = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}.get(
        message.dtype
    )
    if dtype is None:
        raise WireError(f"{where}: unsupported dtype {message.dtype}; send float32 or int64")
    shape = list(message.shape)
    if message.HasField("sparse_csr") or len(shape) > 1:
        raise WireError(
            f"{where}: a {max(len(shape), 2)}-D tensor; this server takes one value per position "
            "(2-D inputs such as top-k distillation targets are not served yet)"
        )
    values = np.frombuffer(message.dense, dtype=dtype)
    if shape and shape[0] != values.size:
        raise WireError(f"{where}: {values.size} values do not fill the shape {shape}")
    return values.astype(np.float64).tolist()


def _tokens(datum: Any, where: str) -> list[int]:
    tokens: list[int] = []
    for number, chunk in enumerate(datum.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(
                f"{where}.model_input.chunks[{number}]: {kind} chunks are not served; send tokens"
            )
        tokens += np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()
    return tokens


def forward_backward_read(body: bytes) -> ForwardBackward:
    """A `forward_backward` request body, checked: a known loss, its inputs present and each as
    long as the datum's tokens."""
    pb = schema()
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except DecodeError as exc:
        raise WireError(f"the body is not a ForwardBackwardRequest: {exc}") from None
    loss = message.loss_fn
    if loss in REFUSED_LOSSES:
        raise WireError(f"loss_fn: {REFUSED_LOSSES[loss]}")
    if loss not in LOSS_INPUTS:
        raise WireError(f"loss_fn: {loss!r} is not a loss; choose one of {', '.join(LOSS_INPUTS)}")
    config: dict[str, float | str] = {key: float(value) for key, value in message.loss_fn_config.items()}
    for key, value in message.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = []
    for index, raw in enumerate(message.data):
        where = f"data[{index}]"
        tokens = _tokens(raw, where)
        inputs = {
            name: _tensor(tensor, f"{where}.loss_fn_inputs.{name}")
            for name, tensor in raw.loss_fn_inputs.items()
        }
        needed = ("target_tokens", *LOSS_INPUTS[loss])
        if loss == "cross_entropy" and "weights" not in inputs and "target_tokens" in inputs:
            inputs["weights"] = [1.0] * len(inputs["target_tokens"])
        for name in needed:
            if name not in inputs:
                raise WireError(f"{where}.loss_fn_inputs: {loss} needs {name!r}")
            if len(inputs[name]) != len(tokens):
                raise WireError(
                    f"{where}.loss_fn_inputs.{name}: {len(inputs[name])} values "
                    f"for {len(tokens)} input tokens"
                )
        if not tokens:
            raise WireError(f"{where}.model_input: no tokens")
        data.append(Datum(tokens=tokens, inputs=inputs))
    if not data:
        raise WireError("data: no datums")
    return ForwardBackward(
        model_id=message.model_id,
        seq_id=message.seq_id,
        loss_fn=loss,
        forward_only=message.forward_only,
        config=config,
        data=data,
    )


def _batched(rows: list[list[float]], dtype: Any) -> Any:
    pb = schema()
    arrays = [np.asarray(row, dtype=dtype) for row in rows]
    offsets = np.cumsum([0, *(array.nbytes for array in arrays)]).astype(np.int64)
    return pb.BatchedTensor(
        data=b"".join(array.tobytes() for array in arrays),
        offsets=offsets.tobytes(),
        dtype=pb.DTYPE_FLOAT32 if dtype == np.float32 else pb.DTYPE_INT64,
    )


def forward_backward_write(
    outputs: dict[str, list[list[float]]], metrics: dict[str, float], count: int
) -> bytes:
    """A `ForwardBackwardOutput`: per datum, each named output (`logprobs`, `elementwise_loss`)."""
    pb = schema()
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=count)
    for name, rows in outputs.items():
        record.fields[name].CopyFrom(_batched(rows, np.float32))
    message = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record])
    for key, value in metrics.items():
        message.metrics[key] = float(value)
    return message.SerializeToString()


@dataclass
class Sequence:
    tokens: list[int]
    logprobs: list[float]
    stopped: bool  # a stop token or sequence ended it; else its token budget ran out


def sample_write(sequences: list[Sequence], prompt_logprobs: list[float | None] | None) -> bytes:
    """A `SampleResponse`; prompt log-probs with NaN where there is none (the first token)."""
    pb = schema()
    message = pb.SampleResponse()
    for sequence in sequences:
        message.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if sequence.stopped else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(sequence.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(sequence.logprobs, dtype=np.float32).tobytes(),
        )
    if prompt_logprobs is not None:
        values = [math.nan if value is None else value for value in prompt_logprobs]
        message.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    return message.SerializeToString()
