"""A learner step's device figures (workers/learners/device_figures.py): the model FLOPs its MFU
counts, the known GPUs' peaks, the step's peak memory, and the MFU itself, formula for formula."""

import os

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from inference.adapters import LoraSettings, lora_wrap
from tests.model_families import FAMILIES, tokenizer_build
from workers.learners.common import learner_create, sequence_batch
from workers.learners.device_figures import (
    device_spec,
    model_flops_per_token,
    peak_flops,
    step_figures,
    step_memory_reset,
    step_peak_memory_mb,
)
from workers.learners.grpo import GRPOBatch, GRPOConfig, learn_on_batch

HIDDEN, MLP, LAYERS, VOCAB, KV = 32, 64, 2, 100, 16  # KV: 2 key/value heads of 8


def tiny_qwen2(*, tied: bool) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=MLP,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    return Qwen2ForCausalLM(config)


def tiny_base_save(path) -> None:
    """A tiny Qwen2 and the suite's tokenizer, saved, for a learner to load."""
    tokenizer = tokenizer_build(FAMILIES["qwen2"])
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=MLP,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=tokenizer.pad_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


def matmul_weights() -> int:
    """Qwen2's layer by hand: q and o (h×h, q biased), k and v (h×kv, biased), the MLP's three
    projections, two norms; then the final norm and the h×vocab head."""
    attention = (HIDDEN * HIDDEN + HIDDEN) + 2 * (HIDDEN * KV + KV) + HIDDEN * HIDDEN
    layer = attention + 3 * HIDDEN * MLP + 2 * HIDDEN
    return LAYERS * layer + HIDDEN + HIDDEN * VOCAB


@pytest.mark.parametrize("tied", [True, False])
def test_all_weights_cost_six_flops_per_weight_and_token_the_input_lookup_none(tied):
    # Tied or not, the head's product counts once and the input embedding's lookup not at all.
    assert model_flops_per_token(tiny_qwen2(tied=tied)) == 6 * matmul_weights()


def test_lora_computes_no_gradients_for_its_frozen_weights():
    model = lora_wrap(tiny_qwen2(tied=True), LoraSettings(rank=4))
    adapters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert adapters > 0
    assert model_flops_per_token(model) == 4 * (matmul_weights() + adapters) + 2 * adapters


@pytest.mark.parametrize(
    ("name", "known"),
    [
        ("NVIDIA H200", ("H200 SXM", 989.4, 4.8)),
        ("NVIDIA H100 80GB HBM3", ("H100 SXM", 989.4, 3.35)),
        ("NVIDIA H100 PCIe", ("H100 PCIe", 756.5, 2.0)),
        ("NVIDIA A100-SXM4-80GB", ("A100 80GB SXM", 312.0, 2.039)),
        ("NVIDIA A100-SXM4-40GB", ("A100 40GB", 312.0, 1.555)),
        ("NVIDIA L4", ("L4", 121.0, 0.3)),
        ("NVIDIA L40S", ("L40S", 362.05, 0.864)),
    ],
)
def test_known_gpus_are_found_by_the_name_torch_reports(name, known):
    spec = device_spec(name)
    assert (spec.name, spec.bf16_tflops, spec.memory_tbps) == known


def test_a_cpu_has_no_peak_unless_one_is_set():
    assert peak_flops(torch.device("cpu")) is None
    assert peak_flops(torch.device("cpu"), override_tflops=2.5) == 2.5e12


def test_without_a_peak_a_step_records_no_mfu_and_with_one_the_formula():
    model = tiny_qwen2(tied=True)
    cpu = torch.device("cpu")
    figures = step_figures(model, cpu, tokens=1000.0, seconds=0.5)
    assert "mfu" not in figures and figures["step_seconds"] == 0.5
    figures = step_figures(model, cpu, tokens=1000.0, seconds=0.5, peak_tflops=0.001)
    assert figures["mfu"] == pytest.approx(6 * matmul_weights() * 1000.0 / 0.5 / 1e9)
    assert "mfu" not in step_figures(model, cpu, tokens=None, seconds=0.5, peak_tflops=0.001)


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's resettable VmHWM")
def test_a_cpu_steps_peak_memory_is_the_processs_peak_since_the_step_began():
    cpu = torch.device("cpu")
    step_memory_reset(cpu)
    before = step_peak_memory_mb(cpu)
    block = torch.ones(64 * 2**20, dtype=torch.float32)  # 256 MiB, touched
    del block
    peak = step_peak_memory_mb(cpu)
    assert peak - before > 250  # the block, less what the allocator had free already
    step_memory_reset(cpu)  # the next step starts from what the process holds now, not the old peak
    assert step_peak_memory_mb(cpu) < peak - 200


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_steps_peak_memory_is_the_allocators_peak_since_the_step_began():
    gpu = torch.device("cuda")
    step_memory_reset(gpu)
    block = torch.ones(64 * 2**20, device=gpu)  # 256 MiB
    del block
    assert step_peak_memory_mb(gpu) >= 256
    step_memory_reset(gpu)
    assert step_peak_memory_mb(gpu) < 256
    spec = device_spec(torch.cuda.get_device_name(gpu))
    assert peak_flops(gpu) == (spec.bf16_tflops * 1e12 if spec is not None else None)


@pytest.mark.parametrize("iterations", [1, 2])
def test_a_grpo_step_counts_the_tokens_it_trained_on_padding_left_out_each_pass_again(tmp_path, iterations):
    path = tmp_path / "model"
    tiny_base_save(path)
    config = GRPOConfig(
        model=str(path), output_dir=str(tmp_path / "out"), num_iterations=iterations, group_size=2
    )
    learner, _ = learner_create(config)
    prompts, completions = [[5, 6, 7], [5, 6, 7], [8, 9], [8, 9]], [[10, 11], [12], [13, 14, 15], [16]]
    sequences = sequence_batch(prompts, completions, learner.tokenizer.pad_token_id)
    old = torch.full((4, sequences.input_ids.size(1) - 1), -5.0)
    metrics = learn_on_batch(
        learner, GRPOBatch(sequences, old, torch.tensor([1.0, -1.0, 1.0, -1.0])), config, None
    )
    assert metrics["tokens"] == (5 + 4 + 5 + 3) * iterations  # 17 real tokens of 4 rows padded to 5
