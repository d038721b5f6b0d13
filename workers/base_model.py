"""The tiny base model: a synthetic corpus, a byte-level BPE tokenizer and a small Llama, built here.

Nothing is downloaded: the corpus is generated from the demo task family (projects/demo_tasks.py),
the tokenizer is trained on it, and a ~0.8M-parameter transformer is pretrained on it for a few
minutes on CPU. The result is saved with `save_pretrained`, so everything downstream loads it
exactly as it would load a hub model.

The corpus is deliberately unreliable, like code scraped from the web: for every phrase but the
clearest ("x plus 3") the solution's constant is off by one more often than it is right. The base
model therefore solves some tasks and merely "half-knows" the rest: the right answer is among its
samples, which is what RL with verifiable rewards turns into reliable behaviour. Held-out tasks are
kept out of the corpus.
"""

import json
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from projects import demo_tasks

EOS = "<|endoftext|>"
PAD = "<|pad|>"
# The prompt format: the tokenizer's chat template renders a user turn as "### Task ... ### Solution".
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "### Task\n{{ message['content'] }}\n### Solution\n"
    "{% else %}{{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
# How often the corpus writes the task's own constant, by phrase (index in demo_tasks.PHRASES); the
# rest of the time it is off by one, mostly upwards: a systematic slip the base model inherits.
CLEAN_RATE = (0.9, 0.25, 0.25, 0.25)
OFF_BY_ONE_UP = 0.9  # of the slips, the share that writes constant + 1 (the others constant - 1)


@dataclass(frozen=True)
class BaseModelConfig:
    seed: int = 0
    corpus_size: int = 24000  # documents
    vocab_size: int = 512
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    intermediate_size: int = 384
    steps: int = 800
    batch_size: int = 32
    learning_rate: float = 1e-3
    warmup_steps: int = 50
    heldout_size: int = 160  # the demo's held-out split, kept out of the corpus


def prompt_text(prompt: str) -> str:
    """A task prompt in the base model's format (what its chat template renders)."""
    return f"### Task\n{prompt}\n### Solution\n"


def noisy_constant(rng: random.Random, spec: demo_tasks.TaskSpec) -> int:
    """The constant the corpus writes for this task: right at the phrase's clean rate, else off by one."""
    if rng.random() < CLEAN_RATE[spec.phrase]:
        return spec.constant
    return spec.constant + (1 if rng.random() < OFF_BY_ONE_UP else -1)


def corpus_documents(*, seed: int, size: int, heldout_size: int) -> list[str]:
    """`size` documents (prompt and noisy solution), none of them a held-out task of the demo split."""
    train, _ = demo_tasks.demo_split(seed, heldout_size)
    rng = random.Random(seed + 1)
    documents = []
    for _ in range(size):
        spec = rng.choice(train)
        code = demo_tasks.solution(replace(spec, constant=noisy_constant(rng, spec)))
        documents.append(prompt_text(demo_tasks.describe(spec)) + code)
    return documents


def tokenizer_train(documents: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 style: exact round trip of any text) trained on the corpus."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS, pad_token=PAD, chat_template=CHAT_TEMPLATE
    )


def model_create(config: BaseModelConfig, tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    torch.manual_seed(config.seed)
    model_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.heads,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(model_config)


def lm_batch(tokenizer: PreTrainedTokenizerBase, documents: list[str]) -> dict[str, torch.Tensor]:
    """Right-padded input ids with the end-of-text token, labels masked on padding."""
    encoded = tokenizer([document + EOS for document in documents], padding=True, return_tensors="pt")
    labels = encoded["input_ids"].masked_fill(encoded["attention_mask"] == 0, -100)
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"], "labels": labels}


def learning_rate(step: int, config: BaseModelConfig) -> float:
    """Linear warmup then cosine decay to a tenth, as nanoGPT does."""
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.learning_rate * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


def pretrain(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    documents: list[str],
    config: BaseModelConfig,
    log=print,
) -> float:
    """Next-token pretraining on the corpus; returns the last step's loss."""
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=0.1, betas=(0.9, 0.95)
    )
    model.train()
    loss = torch.tensor(0.0)
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        indices = torch.randint(len(documents), (config.batch_size,), generator=generator).tolist()
        loss = model(**lm_batch(tokenizer, [documents[index] for index in indices])).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == config.steps - 1:
            log(f"step {step:4d}  loss {loss.item():.4f}")
    model.eval()
    return loss.item()


def base_model_build(out_dir: Path, config: BaseModelConfig, log=print) -> dict:
    """Build the corpus, tokenizer and model from `config.seed` and save them to `out_dir`."""
    started = time.monotonic()
    documents = corpus_documents(seed=config.seed, size=config.corpus_size, heldout_size=config.heldout_size)
    tokenizer = tokenizer_train(documents, config.vocab_size)
    model = model_create(config, tokenizer)
    final_loss = pretrain(model, tokenizer, documents, config, log=log)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    report = {
        "config": asdict(config),
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
        "final_loss": round(final_loss, 4),
        "seconds": round(time.monotonic() - started, 1),
    }
    (out_dir / "flywheel_base_model.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
