"""`score_model` and `label_model` graders name one of the project's tiers as their `model`: through
OpenAI's graders endpoints (`validate`, `run`) and in a reinforcement job, judged by that tier's
model greedily, with exact rewards; a `model` that names no tier is refused in OpenAI's shape,
naming the field's place, before anything is kept.

The judge is the tests' tiny model made to give one verdict whatever it reads (`verdict_model`):
its layers add nothing to the residual stream and its head prefers one token, so greedy decoding
(temperature 0, one token) answers that token, and the reward it yields is known exactly."""

from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from finetuning.models import FineTuningJob
from rewards import services as reward_services
from rewards.models import RewardRule
from runs.models import Run
from tests.run_harness import tiny_model
from tests.test_finetuning import RFT_ITEM, connections_kept, jsonl, lab, launched, upload
from tiers import services as tier_services

__all__ = ["connections_kept", "lab", "tiny_model"]

QUESTION = [
    {"role": "system", "content": "Score the answer from 0 to 10."},
    {"role": "user", "content": "Question: {{ item.question }} Answer: {{ sample.output_text }}"},
]
SCORE = {"type": "score_model", "name": "quality", "model": "judge-7", "input": QUESTION, "range": [0, 10]}
LABEL = {
    "type": "label_model",
    "name": "verdict",
    "model": "judge-y",
    "input": QUESTION,
    "labels": ["y", "n"],
    "passing_labels": ["y"],
}


def verdict_model(source: Path, out: Path, verdict: str) -> Path:
    """A copy of the tiny model that answers `verdict` (one token) to anything, greedily: attention
    and MLP outputs are zeroed (the residual stream is the current token's embedding), the final
    norm keeps only dimension 0, where every embedding is positive, and the (tied) head scores the
    verdict's token highest there."""
    tokenizer = AutoTokenizer.from_pretrained(source)
    [token] = tokenizer.encode(verdict, add_special_tokens=False)
    model = AutoModelForCausalLM.from_pretrained(source)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings = model.model.embed_tokens.weight
        embeddings[:, 0] = 1.0
        embeddings[token, 0] = 2.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture
def judged(lab, tiny_model, tmp_path):
    """The lab with two judge tiers (greedy, one token): `judge-7` says 7, `judge-y` says y."""
    for name, verdict in (("judge-7", "7"), ("judge-y", "y")):
        tier_services.tier_create(
            project=lab["project"],
            by=lab["owner"],
            name=name,
            base_model=str(verdict_model(tiny_model, tmp_path / name, verdict)),
            temperature=0.0,
            max_new_tokens=1,
        )
    return lab


def test_model_graders_are_judged_by_the_tier_they_name_with_exact_rewards(judged):
    graders = judged["client"].fine_tuning.alpha.graders
    item = {"question": "2+2?"}
    scored = graders.run(grader=SCORE, model_sample="4", item=item)
    assert scored.reward == 7.0 and scored.metadata.scores == {"quality": 7.0}
    assert scored.metadata.sampled_model_name == "judge-7"
    assert not any(value for name, value in scored.metadata.errors if name.endswith("_error"))
    # A range the verdict falls outside of is the judge's parse error, scored 0 as OpenAI's is.
    outside = graders.run(grader=SCORE | {"range": [0, 5]}, model_sample="4", item=item)
    assert outside.reward == 0.0 and outside.metadata.errors.model_grader_parse_error is True

    assert graders.run(grader=LABEL, model_sample="4", item=item).reward == 1.0
    failing = graders.run(grader=LABEL | {"passing_labels": ["n"]}, model_sample="4", item=item)
    assert failing.reward == 0.0
    combined = {
        "type": "multi",
        "name": "both",
        "graders": {"quality": SCORE, "verdict": LABEL},
        "calculate_output": "0.1 * quality + verdict",
    }
    ran = graders.run(grader=combined, model_sample="4", item=item)
    assert ran.reward == pytest.approx(1.7) and ran.sub_rewards == {"quality": 7.0, "verdict": 1.0}
    assert graders.validate(grader=combined).grader.type == "multi"


def test_a_model_grader_naming_no_tier_is_refused_naming_the_fields_place(judged):
    client = judged["client"]
    graders = client.fine_tuning.alpha.graders
    for call in (
        lambda grader: graders.validate(grader=grader),
        lambda grader: graders.run(grader=grader, model_sample="4", item={"question": "?"}),
    ):
        with pytest.raises(openai.BadRequestError) as unknown:
            call(SCORE | {"model": "o4-mini"})
        body = unknown.value.body
        assert set(body) == {"message", "type", "param", "code"}
        assert (body["param"], body["code"]) == ("grader.model", "model_not_found")
        assert "no tier named 'o4-mini'" in body["message"] and "judge-7, judge-y" in body["message"]
        with pytest.raises(openai.BadRequestError) as inside:
            call({"type": "multi", "graders": {"v": LABEL | {"model": "gpt-4o"}}, "calculate_output": "v"})
        assert inside.value.body["param"] == "grader.graders.v.model"

    training = upload(client, jsonl(RFT_ITEM | {"question": "3+4?"}))
    with pytest.raises(openai.BadRequestError) as job:
        client.fine_tuning.jobs.create(
            model="small",
            training_file=training.id,
            method={"type": "reinforcement", "reinforcement": {"grader": SCORE | {"model": "o4-mini"}}},
        )
    assert (job.value.body["param"], job.value.body["code"]) == (
        "method.reinforcement.grader.model",
        "model_not_found",
    )
    assert not FineTuningJob.objects.exists() and not Run.objects.exists()
    assert not RewardRule.objects.filter(project=judged["project"]).exists()


def test_a_reinforcement_jobs_model_grader_scores_with_the_tier_it_names(judged):
    client = judged["client"]
    training = upload(client, jsonl(RFT_ITEM | {"question": "3+4?"}))
    job = launched(
        client,
        model="small",  # the policy's tier; the grader's judge is another
        training_file=training.id,
        method={"type": "reinforcement", "reinforcement": {"grader": SCORE}},
    )
    assert job.status == "queued", job.error
    run = FineTuningJob.objects.get(pk=job.id).run
    version = run.reward_rule_version
    # A line's own field is read from the item's metadata, where the job's item keeps it.
    assert version.spec["model"] == "judge-7"
    assert version.spec["input"][1]["content"].startswith("Question: {{ item.metadata.question }}")
    item = reward_services.item_dict(run.task_set_version.items.get())
    dry_run = reward_services.score_pairs(version=version, pairs=[(item, {"output_text": "7"})])
    assert dry_run.pairs[0].result["total"] == 7.0
    assert dry_run.pairs[0].result["errors"] == []
