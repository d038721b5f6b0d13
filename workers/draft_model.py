"""A draft model for speculative decoding: a 1-layer Llama with the base model's own tokenizer,
pretrained on the same synthetic corpus (workers/base_model.py), so it proposes what the base
model would write at a fraction of the cost of a forward pass."""

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

from transformers import AutoTokenizer

from workers.base_model import BaseModelConfig, corpus_documents, model_create, pretrain

DRAFT_CONFIG = BaseModelConfig(
    seed=0,
    corpus_size=12000,
    hidden_size=64,
    layers=1,
    heads=2,
    intermediate_size=192,
    steps=500,
    batch_size=32,
    learning_rate=3e-3,
    warmup_steps=30,
)


def draft_model_build(
    base_dir: Path, out_dir: Path, config: BaseModelConfig = DRAFT_CONFIG, log=print
) -> dict:
    """Train a small model with `base_dir`'s tokenizer on the base model's corpus; save to `out_dir`."""
    started = time.monotonic()
    base_dir = Path(base_dir)
    base_report = base_dir / "flywheel_base_model.json"
    if base_report.exists():  # the same corpus as the base model: same seed and held-out split
        base_config = json.loads(base_report.read_text())["config"]
        config = replace(config, seed=base_config["seed"], heldout_size=base_config["heldout_size"])
    tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
    documents = corpus_documents(seed=config.seed, size=config.corpus_size, heldout_size=config.heldout_size)
    model = model_create(config, tokenizer)
    final_loss = pretrain(model, tokenizer, documents, config, log=log)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    report = {
        "config": asdict(config),
        "draft_of": str(base_dir),
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
        "final_loss": round(final_loss, 4),
        "seconds": round(time.monotonic() - started, 1),
    }
    (out_dir / "flywheel_draft_model.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
