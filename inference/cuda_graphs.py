"""The lean decode step captured as CUDA graphs, one per batch-size bucket (as gpt-fast, SGLang
and vLLM decode).

At batch 1 a small model's decode step is a few hundred kernel launches of microseconds each:
Python and the launches, not the GPU, set the speed. A CUDA graph records the step's launches
once and replays them as one. What a graph records is fixed: the shapes, and the addresses of
every tensor it reads and writes. So the runner keeps, per model, one KV cache and one set of
input buffers that never move: inputs are copied into the buffers before a replay, rows that
leave the batch are compacted in place (`LeanLlama.compact`), and the live rows run in the
smallest bucket that holds them, the bucket's spare rows masked so that they attend to nothing
but themselves (rows never mix: every operation of the step is per row).

Capturing costs a warm-up and a capture per bucket, paid once per model and weights: the runner
is kept with the model (`step_runner`) and reused by every later decode. An update written into
the weights in place (an optimiser step, a colocated weight sync) keeps the graphs valid, the
joined q/k/v and gate/up copies re-read before each decode (`LeanLlama.refresh`); weights that
are new tensors (a model moved, reloaded or cast) get a new runner and new captures.

A capture that fails (an operation a graph cannot hold, on some GPU or torch version) is warned
about and the runner goes on running the same step uncaptured, so decoding never fails for it.
Without CUDA the runner runs the same step on the same buffers without capturing it (`capture`
False): tests/test_cuda_graphs.py checks the buckets, the compaction and the masking that way on
a CPU, and the captures themselves where a GPU is at hand.
"""

import threading
import warnings
import weakref
from typing import Any

import torch

from inference.lean_llama import FAMILIES, LeanLlama, lean_applies

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MIN_CAPACITY = 128  # positions per row: smaller caches cost a capture each and save little
WARMUP_STEPS = 2  # runs before a capture, on a side stream: lazy initialisation happens outside it


def batch_bucket(rows: int) -> int:
    """The batch size a step of `rows` live rows runs at: the smallest bucket that holds them,
    past the largest a multiple of it.

    >>> [batch_bucket(rows) for rows in (1, 3, 8, 9, 256, 257, 600)]
    [1, 4, 8, 16, 256, 512, 768]
    """
    for bucket in BUCKETS:
        if rows <= bucket:
            return bucket
    return -(-rows // BUCKETS[-1]) * BUCKETS[-1]


def capacity_bucket(positions: int) -> int:
    """The positions per row a decode's cache attends over: a power of two, so that calls whose
    prompt and budget differ a little share their captures.

    >>> [capacity_bucket(positions) for positions in (1, 128, 129, 1000)]
    [128, 128, 256, 1024]
    """
    return max(MIN_CAPACITY, 1 << (positions - 1).bit_length())


class StepRunner:
    """One model's decode step over a cache and input buffers that never move, captured as a
    CUDA graph per (batch bucket, capacity) when `capture`, run as is otherwise."""

    def __init__(self, lean: LeanLlama, *, capture: bool, weights: tuple) -> None:
        self.lean = lean
        self.capture = capture
        self.weights = weights  # what the model's weights were: other tensors need a new runner
        self.lock = threading.Lock()  # one decode at a time: they would share the cache
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool: Any = None  # the captures' shared memory pool (a handle torch leaves untyped)
        self.captures = 0
        self.failed: str | None = None  # why a capture failed: the step then runs uncaptured
        self.rows = 0  # the cache's and the buffers' rows
        self.capacity = 0  # the cache's and the buffers' positions per row
        self.span = 0  # the positions this decode attends over (a capacity bucket, ≤ capacity)
        device = lean.device
        self.tokens = torch.zeros((0, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((0, 1), dtype=torch.long, device=device)
        self.key_mask = torch.zeros((0, 0), dtype=torch.bool, device=device)
        self.cursor = torch.zeros(1, dtype=torch.long, device=device)
        self._mask_from: torch.Tensor | None = None  # the key mask the buffer holds a copy of

    def prepare(self, model: torch.nn.Module, rows: int, positions: int) -> None:
        """Room for a decode of `rows` rows and `positions` positions per row (prompt and
        budget), with `model`'s weights as they are now. The cache grows, and the captures that
        read the old one are dropped, only when it is too small; a decode that fits reuses the
        cache and every capture. Call it holding `lock`."""
        self.lean.refresh(model)  # type: ignore[arg-type]
        rows, self.span = batch_bucket(rows), capacity_bucket(positions)
        self._mask_from = None
        self.lean.length = 0
        if rows <= self.rows and self.span <= self.capacity:
            # Masked positions still enter attention's products (times a zero weight): a NaN or
            # an infinity an earlier decode left there would poison this one, so start clean.
            self.lean.clear(rows, self.span)
            return
        self.rows, self.capacity = max(rows, self.rows), max(self.span, self.capacity)
        self.graphs.clear()  # before the cache they captured is freed
        self.pool = None
        self.lean.allocate(self.rows, self.capacity)
        device = self.lean.device
        self.tokens = torch.zeros((self.rows, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((self.rows, 1), dtype=torch.long, device=device)
        self.key_mask = torch.zeros((self.rows, self.capacity), dtype=torch.bool, device=device)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Left-padded prompts into the cache's first rows (not captured: the width varies)."""
        return self.lean.restart(input_ids, attention_mask)

    def select(self, rows: torch.Tensor) -> None:
        """The batch's rows become `rows` of the current ones, compacted in place."""
        self.lean.compact(rows)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """The logits of the token after each live row's `tokens` (n, 1) at `positions` (n, 1);
        `key_mask` (n, K) marks each row's real positions. Run in the smallest bucket that holds
        n rows; the logits are a view of the graph's output, valid until the next step."""
        live = tokens.size(0)
        bucket = batch_bucket(live)
        if key_mask is not self._mask_from:  # the batch changed (its start, or rows left)
            self.key_mask.zero_()  # the bucket's spare rows see only themselves
            self.key_mask[:live, : key_mask.size(1)] = key_mask
            self._mask_from = key_mask
        self.tokens[:live] = tokens
        self.positions[:live] = positions
        self.cursor.fill_(self.lean.length)  # a fill kernel: no host synchronisation
        if self.capture and self.failed is None:
            try:
                graph, logits = self._graph(bucket)
            except RuntimeError as exc:  # decoding still works, only slower: say so and go on
                self._fail(exc)
                logits = self.lean.step(*self._inputs(bucket))
            else:
                graph.replay()
        else:
            logits = self.lean.step(*self._inputs(bucket))
        self.lean.length += 1
        return logits[:live]

    def _fail(self, exc: RuntimeError) -> None:
        """Stop capturing for this runner after a capture failed (the step then runs as is, on the
        same buffers, so the decode under way goes on unchanged)."""
        self.failed = f"{type(exc).__name__}: {exc}"
        self.graphs.clear()
        warnings.warn(f"CUDA graph capture failed, decoding without graphs: {self.failed}", stacklevel=3)

    def _inputs(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return (
            self.tokens[:bucket],
            self.positions[:bucket],
            self.key_mask[:bucket, : self.span],
            self.cursor,
        )

    def _graph(self, bucket: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """The bucket's captured step and its output, captured now if it was not yet."""
        key = (bucket, self.span)
        if key not in self.graphs:
            self.graphs[key] = self._capture(bucket)
        return self.graphs[key]

    def _capture(self, bucket: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Warm the step up on a side stream (lazy initialisation and autotuning happen outside
        the capture), then capture it. The warm-up writes this step's column of the cache with
        this step's inputs, which the replay that follows writes again."""
        inputs = self._inputs(bucket)
        side = torch.cuda.Stream(device=self.lean.device)
        side.wait_stream(torch.cuda.current_stream(self.lean.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self.lean.step(*inputs)
        torch.cuda.current_stream(self.lean.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a serving process's other threads may use CUDA while this one captures.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            logits = self.lean.step(*inputs)
        self.pool = graph.pool()
        self.captures += 1
        return graph, logits


# A model's runner lives as long as the model (its weights are what the runner reads).
_runners: "weakref.WeakKeyDictionary[torch.nn.Module, StepRunner]" = weakref.WeakKeyDictionary()


def weights_key(model: torch.nn.Module) -> tuple:
    """What the model's weights are: their addresses, device and dtype. The same tensors updated
    in place keep it; new tensors change it (the runner holds the old ones it reads directly, so
    a new one cannot reuse their address)."""
    return tuple(
        (parameter.data_ptr(), parameter.device, parameter.dtype) for parameter in model.parameters()
    )


def step_runner(model: torch.nn.Module, *, capture: bool = True) -> StepRunner | None:
    """The runner of `model`'s decode step, made once per model and weights and reused by every
    decode after (`prepare` re-reads the joined weights); None where the lean path does not apply."""
    if not isinstance(model, FAMILIES) or not lean_applies(model):
        return None
    key = weights_key(model)
    runner = _runners.get(model)
    if runner is None or runner.weights != key or runner.capture != capture:
        runner = StepRunner(LeanLlama(model), capture=capture, weights=key)
        _runners[model] = runner
    return runner
