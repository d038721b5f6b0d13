"""Sampling for the Tinker API, on the rollout workers: a sampling session's weights (a policy version
of a Tinker model's run, or a tier's base model) decode the request's prompt tokens `num_samples`
times with the same decoder as runs (inference.decoding.decode), and the answer is the SDK's
SampleResponse: each sequence's tokens, their log-probs and why it stopped, and the prompt's
log-probs when asked.

Where Flywheel's decoder differs from Tinker's sampler the request is refused by name rather than
answered differently: top-k log-probs, target and alternative prompt tokens. Token-id stops stop
at their text; an empty stop list still stops at the end-of-sequence token.
"""

import json
from dataclasses import replace

import torch

from inference.decoding import TierModel, decode
from inference.settings import MAX_NEW_TOKENS, TierSettings, tier_snapshot
from tinker_api import services as tinker_services
from tinker_api import wire
from tinker_api.models import TinkerSampler
from workers.run_rollout import policy_at_path, policy_version_load

REFUSED = {
    "topk_prompt_logprobs": "top-k prompt log-probs are not served yet",
    "topk_sample_logprobs": "top-k sample log-probs are not served yet",
    "target_prompt_logprobs": "target prompt log-probs are not served yet",
    "prompt_alt_tokens_k": "alternative prompt tokens are not served yet",
}


class SampleError(ValueError):
    """The request cannot be sampled as sent; the text names the field."""


def sample_run(request_id: int) -> None:
    request = tinker_services.sample_take(request_id=request_id)
    if request is None:  # another worker has it, or its session ended
        return
    try:
        answer = sample(_weights(request.sampler), json.loads(bytes(request.body)))
    except SampleError as exc:
        tinker_services.request_failed(request=request, error=str(exc))
        return
    except Exception as exc:  # noqa: BLE001  (the client reads why; the worker goes on)
        tinker_services.request_failed(
            request=request, error=f"{type(exc).__name__}: {exc}", user_error=False
        )
        return
    tinker_services.request_done(request=request, result=answer, proto=True)


def _weights(sampler: TinkerSampler) -> TierModel:
    if sampler.run is not None:
        settings = TierSettings.from_config(sampler.run.tier_config)
        return policy_version_load(sampler.run, sampler.policy_version or 0, settings)
    if sampler.tier is None:
        raise SampleError("base_model: the sampling session's tier was deleted")
    settings = TierSettings.from_config(tier_snapshot(sampler.tier))
    return policy_at_path(str(settings.base_model), 0, settings)


def _settings(tier: TierModel, params: dict, tokenizer) -> TierSettings:
    stops = params.get("stop")
    if isinstance(stops, str):
        stops = [stops]
    texts = tuple(tokenizer.decode([stop]) if isinstance(stop, int) else str(stop) for stop in stops or ())
    top_k = int(params.get("top_k", -1))
    max_tokens = params.get("max_tokens") or tier.settings.max_new_tokens
    if not 1 <= int(max_tokens) <= MAX_NEW_TOKENS:
        raise SampleError(f"sampling_params.max_tokens: must be from 1 to {MAX_NEW_TOKENS}")
    temperature = float(params.get("temperature", 1.0))
    if temperature < 0:
        raise SampleError("sampling_params.temperature: must be 0 or more")
    top_p = float(params.get("top_p", 1.0))
    if not 0 < top_p <= 1:
        raise SampleError("sampling_params.top_p: must be in (0, 1]")
    return replace(
        tier.settings,
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        stop=texts,
        max_new_tokens=int(max_tokens),
        speculation="none",
        speculative_tokens=0,
        batch_size=1 << 30,
    )


def sample(tier: TierModel, body: dict) -> bytes:
    for name, why in REFUSED.items():
        if body.get(name):
            raise SampleError(f"{name}: {why}")
    tokens = [token for chunk in body["prompt"]["chunks"] for token in chunk.get("tokens", [])]
    if not tokens:
        raise SampleError("prompt: no tokens")
    vocabulary = tier.model.get_input_embeddings().num_embeddings
    if any(not isinstance(token, int) or not 0 <= token < vocabulary for token in tokens):
        raise SampleError(f"prompt: token ids must be from 0 to {vocabulary - 1}")
    params = body.get("sampling_params") or {}
    settings = _settings(tier, params, tier.tokenizer)
    generator = None
    if params.get("seed") is not None:
        generator = torch.Generator(device=tier.device).manual_seed(int(params["seed"]))
    count = int(body.get("num_samples", 1))
    completions = decode(tier, [tuple(tokens)] * count, settings, generator=generator)
    sequences = [
        wire.Sequence(tokens=c.token_ids, logprobs=c.logprobs, stopped=c.finish_reason == "stop")
        for c in completions
    ]
    prompt_logprobs = _prompt_logprobs(tier, tokens) if body.get("prompt_logprobs") else None
    return wire.sample_write(sequences, prompt_logprobs)


@torch.no_grad()
def _prompt_logprobs(tier: TierModel, tokens: list[int]) -> list[float | None]:
    """Each prompt token's log-prob given the tokens before it (none for the first)."""
    ids = torch.tensor([tokens], device=tier.device)
    logits = tier.model(input_ids=ids).logits[0, :-1].float()
    picked = logits.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return [None, *picked.cpu().tolist()]
