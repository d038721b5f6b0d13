"""Tiny random-initialised causal LMs of real families, each with its own tokenizer and chat template.

Nothing is downloaded: a small byte-level BPE tokenizer is trained here on the demo task texts,
with the family's special tokens (BOS, EOS, turn markers), its pad token or none, its padding side,
and the family's real chat template written into `tokenizer_config.json`; the model is the
family's architecture at a few thousand parameters, saved with `save_pretrained`, with the family's
`generation_config.json` (several end-of-sequence ids where the family has them) and its
tied-embeddings setting. They load through the Auto classes exactly as a hub checkpoint would.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationConfig,
    PreTrainedTokenizerFast,
)

from projects.demo_tasks import demo_task_sets

# The families' own templates (as their instruct checkpoints ship them, whitespace kept).
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
CHATML_TEMPLATE = (  # Qwen2-Instruct
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MISTRAL_TEMPLATE = (  # Mistral-7B-Instruct-v0.1: no system role, alternating turns
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
GEMMA_TEMPLATE = (  # gemma-2-it: no system role
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)
PHI3_TEMPLATE = (  # Phi-3-mini-instruct
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)


@dataclass(frozen=True)
class Family:
    """One family: its architecture, its tokenizer's special tokens and its chat template."""

    name: str
    model_type: str
    specials: tuple[str, ...]  # every special token, in id order
    eos: str
    bos: str | None = None
    pad: str | None = None  # None: the tokenizer has no pad token (Llama, Mistral, GPT-NeoX)
    generation_eos: tuple[str, ...] = ()  # generation_config's eos ids, when several
    chat_template: str | None = None
    padding_side: str = "right"
    tied: bool = False
    add_bos: bool = False  # the tokenizer prepends BOS to raw text (Llama, Mistral, Gemma)
    config: dict = field(default_factory=dict)


FAMILIES = {
    family.name: family
    for family in (
        Family(
            "llama",
            "llama",
            (
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
            ),
            eos="<|eot_id|>",
            bos="<|begin_of_text|>",
            generation_eos=("<|end_of_text|>", "<|eot_id|>"),
            chat_template=LLAMA3_TEMPLATE,
            add_bos=True,
        ),
        Family(
            "qwen2",
            "qwen2",
            ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
            eos="<|im_end|>",
            pad="<|endoftext|>",
            generation_eos=("<|im_end|>", "<|endoftext|>"),
            chat_template=CHATML_TEMPLATE,
            tied=True,
        ),
        Family(
            "mistral",
            "mistral",
            ("<unk>", "<s>", "</s>", "[INST]", "[/INST]"),
            eos="</s>",
            bos="<s>",
            chat_template=MISTRAL_TEMPLATE,
            padding_side="left",
            add_bos=True,
        ),
        Family(
            "gemma",
            "gemma",
            ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
            eos="<eos>",
            bos="<bos>",
            pad="<pad>",
            generation_eos=("<eos>", "<end_of_turn>"),
            chat_template=GEMMA_TEMPLATE,
            tied=True,
            add_bos=True,
            config={"head_dim": 16},
        ),
        Family(
            "phi3",
            "phi3",
            ("<unk>", "<s>", "</s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
            eos="<|endoftext|>",
            pad="<|endoftext|>",
            generation_eos=("<|endoftext|>", "<|end|>", "<|assistant|>"),
            chat_template=PHI3_TEMPLATE,
        ),
        Family("gpt_neox", "gpt_neox", ("<|endoftext|>",), eos="<|endoftext|>", bos="<|endoftext|>"),
        Family("gpt2", "gpt2", ("<|endoftext|>",), eos="<|endoftext|>", bos="<|endoftext|>", tied=True),
    )
}
# Sizes every family understands (GPT-2 and GPT-NeoX name them their own way: AutoConfig maps them).
SIZES = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
GPT2_SIZES = {"n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 256}


def corpus(seed: int = 0) -> list[str]:
    """Texts to train the tokenizer on: the demo tasks' prompts and solutions."""
    sets = demo_task_sets(seed=seed, train_size=120, heldout_size=20)
    return [item["prompt"] + "\n" + item["reference_solution"] for split in sets.values() for item in split]


def tokenizer_build(family: Family, vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with the family's special tokens, BOS rule, pad and template."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(family.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    if family.add_bos:
        bos_id = tokenizer.token_to_id(family.bos)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{family.bos} $A", pair=f"{family.bos} $A $B", special_tokens=[(family.bos, bos_id)]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    extra = [token for token in family.specials if token not in (family.eos, family.bos, family.pad)]
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=family.bos,
        eos_token=family.eos,
        pad_token=family.pad,
        additional_special_tokens=extra,
        padding_side=family.padding_side,
        chat_template=family.chat_template,
    )


def model_build(family: Family, tokenizer: PreTrainedTokenizerFast, *, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    sizes = GPT2_SIZES if family.model_type == "gpt2" else SIZES
    config = AutoConfig.for_model(
        family.model_type,
        vocab_size=len(tokenizer),
        tie_word_embeddings=family.tied,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids(family.eos),
        pad_token_id=tokenizer.pad_token_id,
        **sizes,
        **family.config,
    )
    return AutoModelForCausalLM.from_config(config)


def family_model_save(name: str, path: Path, *, seed: int = 0) -> Path:
    """Build family `name` tiny and save it with `save_pretrained` into `path`; returns `path`."""
    family = FAMILIES[name]
    tokenizer = tokenizer_build(family)
    model = model_build(family, tokenizer, seed=seed)
    eos_ids = [tokenizer.convert_tokens_to_ids(token) for token in family.generation_eos or (family.eos,)]
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos_ids if len(eos_ids) > 1 else eos_ids[0],
        pad_token_id=tokenizer.pad_token_id,
    )
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    template_into_tokenizer_config(path, family.chat_template)
    return path


def template_into_tokenizer_config(path: Path, template: str | None) -> None:
    """The chat template inside `tokenizer_config.json`, where most hub checkpoints keep it (newer
    savers write a separate `chat_template.jinja`; both load the same)."""
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    (path / "chat_template.jinja").unlink(missing_ok=True)
    if template:
        config["chat_template"] = template
    config_path.write_text(json.dumps(config, indent=2) + "\n")
