"""Sampling for the Tinker API, on the rollout workers: a sampling session's weights (a policy version
of a Tinker model's run, or a tier's base model) decode the request's prompt tokens `num_samples`
times with the same decoder as runs (inference.decoding.decode), and the answer is the SDK's
SampleResponse: each sequence's tokens, their log-probs and why it stopped, and the prompt's
log-probs when asked. The pending requests of one sampling session decode as one batch (a loop
sends one request per episode: the cookbook's RL loop sends a batch's worth at once).

Where Flywheel's decoder differs from Tinker's sampler the request is refused by name rather than
answered differently: top-k log-probs, target and alternative prompt tokens. Token-id stops stop
at their text; an empty stop list still stops at the end-of-sequence token.
"""

import itertools
import json
import logging
from dataclasses import dataclass, replace

import torch
from django.conf import settings

from inference.decoding import TierModel, decode
from inference.engines import EngineTier
from inference.settings import MAX_NEW_TOKENS, TierSettings, tier_snapshot
from tinker_api import services as tinker_services
from tinker_api import wire
from tinker_api.models import TinkerRequest, TinkerSampler
from traces.ingest import traces_ingest
from workers.run_rollout import policy_at_path, policy_version_load

logger = logging.getLogger(__name__)
REFUSED = {
    "topk_prompt_logprobs": "top-k prompt log-probs are not served yet",
    "topk_sample_logprobs": "top-k sample log-probs are not served yet",
    "target_prompt_logprobs": "target prompt log-probs are not served yet",
    "prompt_alt_tokens_k": "alternative prompt tokens are not served yet",
}


class SampleError(ValueError):
    """The request cannot be sampled as sent; the text names the field."""


def sample_run(request_id: int) -> None:
    """Sample the request and the other pending ones of its sampling session, as one batch."""
    requests = tinker_services.samples_take(
        request_id=request_id, limit=settings.FLYWHEEL_TINKER_SAMPLE_BATCH
    )
    if not requests:  # another worker has it, or its session ended
        return
    try:
        tier = sampler_weights(request_sampler(requests[0]))
        plans: list[tuple[TinkerRequest, Plan]] = []
        for request in requests:
            try:
                plans.append((request, plan(tier, json.loads(bytes(request.body)))))
            except SampleError as exc:
                tinker_services.request_failed(request=request, error=str(exc))
        for batch in batches(plans):
            sampled = sample_batch(tier, [p for _, p in batch])
            if settings.FLYWHEEL_TINKER_RECORD_SAMPLES:  # before the answers: what a client saw is there
                samples_record(tier, [(r, p, seqs) for (r, p), (seqs, _) in zip(batch, sampled, strict=True)])
            for (request, _), (sequences, prompt_logprobs) in zip(batch, sampled, strict=True):
                answer = wire.sample_write(sequences, prompt_logprobs)
                tinker_services.request_done(request=request, result=answer, proto=True)
    except SampleError as exc:
        for request in requests:
            tinker_services.request_failed(request=request, error=str(exc))
    except Exception as exc:  # noqa: BLE001  (the client reads why; the worker goes on)
        for request in TinkerRequest.objects.filter(
            pk__in=[r.pk for r in requests], status=TinkerRequest.Status.RUNNING
        ):
            tinker_services.request_failed(
                request=request, error=f"{type(exc).__name__}: {exc}", user_error=False
            )


def request_sampler(request: TinkerRequest) -> TinkerSampler:
    """The sampling session a sample request samples from."""
    if request.sampler is None:
        raise SampleError("sampling_session_id: the request names no sampling session")
    return request.sampler


def sampler_weights(sampler: TinkerSampler) -> TierModel:
    if sampler.run is not None:
        tier_settings = TierSettings.from_config(sampler.run.tier_config)
        loaded = policy_version_load(sampler.run, sampler.policy_version or 0, tier_settings)
        if isinstance(loaded, EngineTier):
            raise SampleError("model_path: the run's tier decodes on an external engine; sample there")
        return loaded
    if sampler.tier is None:
        raise SampleError("base_model: the sampling session's tier was deleted")
    tier_settings = TierSettings.from_config(tier_snapshot(sampler.tier))
    return policy_at_path(str(tier_settings.base_model), 0, tier_settings)


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


@dataclass(frozen=True)
class Plan:
    """One sample request, checked: what to decode and how."""

    tokens: tuple[int, ...]
    count: int
    settings: TierSettings
    seed: int | None
    prompt_logprobs: bool


def plan(tier: TierModel, body: dict) -> Plan:
    for name, why in REFUSED.items():
        if body.get(name):
            raise SampleError(f"{name}: {why}")
    tokens = tuple(token for chunk in body["prompt"]["chunks"] for token in chunk.get("tokens", []))
    if not tokens:
        raise SampleError("prompt: no tokens")
    embeddings = tier.model.get_input_embeddings()
    # The embedding's rows: a model may have more than its tokenizer's tokens.
    vocabulary = (
        embeddings.num_embeddings if isinstance(embeddings, torch.nn.Embedding) else len(tier.tokenizer)
    )
    if any(not isinstance(token, int) or not 0 <= token < vocabulary for token in tokens):
        raise SampleError(f"prompt: token ids must be from 0 to {vocabulary - 1}")
    params = body.get("sampling_params") or {}
    seed = params.get("seed")
    return Plan(
        tokens=tokens,
        count=int(body.get("num_samples", 1)),
        settings=_settings(tier, params, tier.tokenizer),
        seed=None if seed is None else int(seed),
        prompt_logprobs=bool(body.get("prompt_logprobs")),
    )


def batches(plans: list[tuple[TinkerRequest, Plan]]) -> list[list[tuple[TinkerRequest, Plan]]]:
    """Requests that can decode together: the same settings and no seed. A seeded request decodes
    alone, so its samples are what its seed gives whatever else was pending."""
    groups: list[list[tuple[TinkerRequest, Plan]]] = []
    for entry in plans:
        same = next(
            (
                g
                for g in groups
                if entry[1].seed is None and g[0][1].seed is None and g[0][1].settings == entry[1].settings
            ),
            None,
        )
        if same is None:
            groups.append([entry])
        else:
            same.append(entry)
    return groups


Sampled = tuple[list[wire.Sequence], list[float | None] | None]  # the sequences, the prompt's log-probs


def sample_batch(tier: TierModel, plans: list[Plan]) -> list[Sampled]:
    """Each plan's sequences (and prompt log-probs when asked), decoded in one call (the plans
    share settings; a seed only alone)."""
    seed = plans[0].seed
    generator = None if seed is None else torch.Generator(device=tier.device).manual_seed(seed)
    prompts = [p.tokens for p in plans for _ in range(p.count)]
    completions = iter(decode(tier, prompts, plans[0].settings, generator=generator))
    sampled: list[Sampled] = []
    for p in plans:
        sequences = [
            wire.Sequence(tokens=c.token_ids, logprobs=c.logprobs, stopped=c.finish_reason == "stop")
            for c in itertools.islice(completions, p.count)
        ]
        sampled.append((sequences, _prompt_logprobs(tier, list(p.tokens)) if p.prompt_logprobs else None))
    return sampled


def sample(tier: TierModel, body: dict) -> bytes:
    """One request's SampleResponse."""
    return wire.sample_write(*sample_batch(tier, [plan(tier, body)])[0])


@torch.no_grad()
def _prompt_logprobs(tier: TierModel, tokens: list[int]) -> list[float | None]:
    """Each prompt token's log-prob given the tokens before it (none for the first)."""
    ids = torch.tensor([tokens], device=tier.device)
    logits = tier.model(input_ids=ids).logits[0, :-1].float()
    picked = logits.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return [None, *picked.cpu().tolist()]


def samples_record(tier: TierModel, answered: list[tuple[TinkerRequest, Plan, list[wire.Sequence]]]) -> None:
    """Each sampled sequence as a trace of the session's project, for reviewers to read and label:
    named by its request and index, so a redelivered request records the same traces again. The
    client has its answer already; a failure to record is logged, not sent to it."""
    sampler = request_sampler(answered[0][0])
    model = f"run-{sampler.run_id}" if sampler.run_id else sampler.base_model
    reports = []
    for request, p, sequences in answered:
        prompt = tier.tokenizer.decode(list(p.tokens), skip_special_tokens=True)
        for index, sequence in enumerate(sequences):
            reports.append(
                {
                    "id": f"tinker-{request.key}-{index}",
                    "prompt": prompt or "(special tokens only)",
                    "completion": tier.tokenizer.decode(sequence.tokens, skip_special_tokens=True),
                    "model": model[:200],
                    "tier": sampler.tier_id,
                    "metadata": {
                        "source": "tinker",
                        "run": sampler.run_id,
                        "policy_version": sampler.policy_version,
                        "sampling_session": sampler.key,
                        "request": request.key,
                        "sample": index,
                        "stop_reason": "stop" if sequence.stopped else "length",
                        "completion_tokens": len(sequence.tokens),
                    },
                }
            )
    try:
        traces_ingest(project=sampler.session.project, reports=reports)
    except Exception:  # noqa: BLE001  (the samples were answered; only their record is lost)
        logger.exception("recording %d Tinker samples as traces failed", len(reports))
