"""The tiny base model the learner tests build: seconds to make, enough to compute with."""

from workers.base_model import BaseModelConfig

TINY = BaseModelConfig(
    seed=3,
    corpus_size=200,
    vocab_size=300,
    hidden_size=32,
    layers=1,
    heads=2,
    intermediate_size=64,
    steps=3,
    batch_size=8,
    warmup_steps=1,
    heldout_size=20,
)
