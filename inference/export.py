"""Exporting a policy: a `save_pretrained` folder with a model card, as files or a streamed archive.

A policy version is a folder that `save_pretrained` wrote: full weights (`config.json`,
`model.safetensors`, the tokenizer) or, for a LoRA run, a peft adapter (`adapter_config.json`,
`adapter_model.safetensors`, the tokenizer). An export is that folder's files plus a model card
(`README.md`); a LoRA adapter is exported as it is, or merged into its base model
(`adapter_merge`), which peft does and `from_pretrained` then loads with no peft at all.

Archives (zip or tar.gz) are written as they are read, a chunk at a time: a multi-gigabyte model
never sits in memory. Django-free; torch and peft are imported only to merge an adapter.
"""

import io
import json
import shutil
import tarfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ARCHIVES = {"tar.gz": "application/gzip", "zip": "application/zip"}
ADAPTER_CONFIG = "adapter_config.json"
CARD = "README.md"
CHUNK = 1 << 20
# Weights are dense: compressing them costs minutes of CPU for a few percent. Stored as they are in a
# zip; a tar.gz compresses at the fastest level.
DENSE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npz")
GZIP_LEVEL = 1
Progress = Callable[[int], None]  # called with the bytes just written


class ExportError(ValueError):
    """The export cannot be made: the message says what is missing or wrong."""


def is_adapter(folder: Path) -> bool:
    """Whether the folder holds a peft adapter rather than full weights."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_base(folder: Path) -> str | None:
    """The base model an adapter was trained on, as its `adapter_config.json` names it."""
    config = json.loads((Path(folder) / ADAPTER_CONFIG).read_text())
    return config.get("base_model_name_or_path") or None


def adapter_merge(adapter: Path, base: str | Path, out: Path) -> Path:
    """The adapter merged into its base, saved with `save_pretrained` (and the tokenizer) at `out`.
    Written beside `out` and renamed into place, so a half-written merge is never exported."""
    try:
        from peft import PeftModel
    except ImportError as exc:
        raise ExportError("merging a LoRA adapter needs peft; export the adapter instead") from exc
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    if out.is_dir():
        return out
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(base))
    except OSError as exc:
        raise ExportError(f"cannot load the adapter's base model {base}: {exc}") from exc
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(partial)
    tokenizer_source = adapter if (Path(adapter) / "tokenizer_config.json").is_file() else base
    AutoTokenizer.from_pretrained(str(tokenizer_source)).save_pretrained(partial)
    partial.rename(out)
    return out


# --- the model card ----------------------------------------------------------------------------


@dataclass
class ModelCard:
    """What a model card says about an exported checkpoint."""

    title: str
    base_model: str
    method: str
    weights: str  # "full", "LoRA adapter" or "LoRA merged into the base"
    step: int
    policy_version: int
    data: dict[str, Any] = field(default_factory=dict)  # task set, version, split sizes
    reward_rule: dict[str, Any] = field(default_factory=dict)  # name, version, spec
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    decoding: dict[str, Any] = field(default_factory=dict)  # the tier's settings
    held_out: list[dict[str, Any]] = field(default_factory=list)  # {"step": n, name: value, ...}
    source: str = ""  # where it came from: project, run


def _json_block(value: Any) -> str:
    return "```json\n" + json.dumps(value, indent=2, sort_keys=True, default=str) + "\n```"


def _held_out_table(rows: list[dict[str, Any]], step: int) -> str:
    if not rows:
        return "No held-out evaluation has been recorded for this run yet."
    names = sorted({name for row in rows for name in row if name != "step"})
    lines = ["| step | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for row in rows:
        mark = " (this checkpoint)" if row["step"] == step else ""
        cells = [f"{row[name]:.4g}" if isinstance(row.get(name), float) else "" for name in names]
        lines.append(f"| {row['step']}{mark} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def model_card_text(card: ModelCard) -> str:
    """The card as Markdown with the Hugging Face metadata header.

    >>> text = model_card_text(ModelCard("t", "org/base", "grpo", "full", 2, 2))
    >>> text.splitlines()[:4]
    ['---', 'library_name: transformers', 'base_model: org/base', 'tags:']
    """
    header = [
        "---",
        "library_name: transformers",
        f"base_model: {json.dumps(card.base_model)[1:-1]}",
        "tags:",
        "- flywheel",
        f"- {card.method}",
        "---",
    ]
    body = [
        f"# {card.title}",
        "",
        f"Exported by Flywheel from {card.source or 'a run'}: the policy at learner step {card.step} "
        f"(policy version {card.policy_version}).",
        "",
        "## Training",
        "",
        f"- Base model: `{card.base_model}`",
        f"- Method: {card.method.upper()}",
        f"- Weights: {card.weights}",
        "",
        "Hyperparameters (resolved):",
        "",
        _json_block(card.hyperparameters),
        "",
        "## Data",
        "",
        *[f"- {name}: {value}" for name, value in card.data.items()],
        "",
        "## Reward rule",
        "",
        *[f"- {name}: {value}" for name, value in card.reward_rule.items() if name != "spec"],
        "",
        _json_block(card.reward_rule.get("spec", {})),
        "",
        "## Held-out results",
        "",
        _held_out_table(card.held_out, card.step),
        "",
        "## Decoding (the run's tier)",
        "",
        _json_block(card.decoding),
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
        'model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")',
        "```",
        "",
    ]
    if card.weights == "LoRA adapter":
        body[-3:-3] = [
            "",
            "from peft import PeftModel",
            "",
            f'model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("{card.base_model}"),'
            ' "path/to/this/folder")',
        ]
    return "\n".join(header + body)


# --- files and archives ------------------------------------------------------------------------

Entry = tuple[str, Path | bytes]  # a name inside the export folder, and a file or the bytes


def export_entries(folder: Path, card: str) -> list[Entry]:
    """The export's files: every file the folder holds (its own card replaced) and the card."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ExportError(f"the policy folder {folder} is gone")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != CARD)
    return [(p.relative_to(folder).as_posix(), p) for p in files] + [(CARD, card.encode())]


def entries_size(entries: list[Entry]) -> int:
    return sum(len(data) if isinstance(data, bytes) else data.stat().st_size for _, data in entries)


def _pieces(data: Path | bytes) -> Iterator[bytes]:
    if isinstance(data, bytes):
        yield data
        return
    with open(data, "rb") as handle:
        while chunk := handle.read(CHUNK):
            yield chunk


def folder_write(entries: list[Entry], out: Path, progress: Progress | None = None) -> Path:
    """The export as a folder at `out` (written beside it, then renamed into place)."""
    out = Path(out)
    if out.exists():
        raise ExportError(f"{out} already exists; choose another --out or remove it")
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    for name, data in entries:
        target = partial / name
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as handle:
            for chunk in _pieces(data):
                handle.write(chunk)
                if progress:
                    progress(len(chunk))
    partial.rename(out)
    return out


def archive_chunks(
    entries: list[Entry], root: str, archive: str, progress: Progress | None = None
) -> Iterator[bytes]:
    """The export as a zip or tar.gz whose files sit under `root/`, a chunk at a time."""
    if archive not in ARCHIVES:
        raise ExportError(f"archive must be one of {', '.join(ARCHIVES)}; got {archive!r}")
    chunks = _zip_chunks if archive == "zip" else _tar_gz_chunks
    return chunks(entries, root, progress)


class _Sink(io.RawIOBase):
    """A write-only stream whose bytes are taken as they come (zipfile sees it cannot seek)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


def _zip_chunks(entries: list[Entry], root: str, progress: Progress | None) -> Iterator[bytes]:
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(f"{root}/{name}", date_time=time.localtime()[:6])
            dense = name.endswith(DENSE_SUFFIXES)
            info.compress_type = zipfile.ZIP_STORED if dense else zipfile.ZIP_DEFLATED
            with archive.open(info, "w", force_zip64=True) as member:
                for chunk in _pieces(data):
                    member.write(chunk)
                    if progress:
                        progress(len(chunk))
                    if out := sink.take():
                        yield out
            if out := sink.take():
                yield out
    if out := sink.take():
        yield out


def _tar_gz_chunks(entries: list[Entry], root: str, progress: Progress | None) -> Iterator[bytes]:
    """A ustar/pax stream written by hand (tarfile would read a member whole), gzip-compressed."""
    gzip = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
    now = int(time.time())
    for name, data in entries:
        info = tarfile.TarInfo(f"{root}/{name}")
        info.size = len(data) if isinstance(data, bytes) else data.stat().st_size
        info.mtime, info.mode = now, 0o644
        if out := gzip.compress(info.tobuf(format=tarfile.PAX_FORMAT)):
            yield out
        for chunk in _pieces(data):
            if progress:
                progress(len(chunk))
            if out := gzip.compress(chunk):
                yield out
        if out := gzip.compress(b"\0" * (-info.size % tarfile.BLOCKSIZE)):
            yield out
    yield gzip.compress(b"\0" * (2 * tarfile.BLOCKSIZE)) + gzip.flush()
