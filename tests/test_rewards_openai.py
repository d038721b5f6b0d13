"""OpenAI grader JSON: imports and exports unchanged, and scores as OpenAI documents."""

import pytest

from rewards.engine import Sample, score, validate_rule
from rewards.openai_format import OpenAIFormatError, from_openai, to_openai

ITEM = {"id": "q1", "kind": "answer", "split": "train", "prompt": "Name the red planet.", "reference": "Mars"}
STRING_CHECK = {
    "type": "string_check",
    "name": "exact",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.reference }}",
    "operation": "ilike",
}
TEXT_SIMILARITY = {
    "type": "text_similarity",
    "name": "fuzzy",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.reference }}",
    "evaluation_metric": "fuzzy_match",
    "pass_threshold": 0.8,
}
SCORE_MODEL = {
    "type": "score_model",
    "name": "judge",
    "model": "o4-mini",
    "input": [
        {"role": "system", "content": "Score the answer from 0 to 1."},
        {
            "role": "user",
            "content": [
                {
                    "type": "input_text",
                    "text": "Reference: {{ item.reference }}. Answer: {{ sample.output_text }}",
                }
            ],
        },
    ],
    "range": [0, 1],
    "sampling_params": {"temperature": 0, "seed": 1, "max_completions_tokens": 64},
}
LABEL_MODEL = {
    "type": "label_model",
    "name": "verdict",
    "model": "gpt-4o-mini",
    "input": [
        {"role": "user", "content": "Is {{ sample.output_text }} {{ item.reference }}?", "type": "message"}
    ],
    "labels": ["yes", "no"],
    "passing_labels": ["yes"],
}
PYTHON = {
    "type": "python",
    "name": "length",
    "source": (
        "def grade(sample, item) -> float:\n"
        "    return 1.0 if sample['output_text'].strip() == item['reference'] else 0.0\n"
    ),
    "image_tag": "2025-05-08",
}
MULTI = {
    "type": "multi",
    "name": "combined",
    "graders": {"exact": STRING_CHECK, "fuzzy": TEXT_SIMILARITY},
    "calculate_output": "0.5 * exact + 0.5 * fuzzy ^ 2",
}
GRADERS = [STRING_CHECK, TEXT_SIMILARITY, SCORE_MODEL, LABEL_MODEL, PYTHON, MULTI]


@pytest.mark.parametrize("grader", GRADERS, ids=lambda grader: grader["type"])
def test_openai_graders_round_trip_unchanged_and_validate(grader):
    spec = from_openai(grader)
    assert spec == grader
    assert to_openai(spec) == grader
    assert validate_rule(spec) == []


def test_string_check_and_text_similarity_score_as_openai_documents():
    assert score(from_openai(STRING_CHECK), ITEM, Sample(output_text="It is MARS")).total == 1.0
    assert score(from_openai(STRING_CHECK), ITEM, Sample(output_text="Venus")).total == 0.0
    assert score(from_openai(TEXT_SIMILARITY), ITEM, Sample(output_text="Mars")).total == 1.0
    assert score(from_openai(TEXT_SIMILARITY), ITEM, Sample(output_text="Marz")).total == 0.75  # 2 * 3 / 8


def test_multi_writes_powers_with_a_caret_and_names_sub_graders_by_key():
    result = score(from_openai(MULTI), ITEM, Sample(output_text="Marz"))
    assert result.components == {"exact": 0.0, "fuzzy": 0.75}
    assert result.total == pytest.approx(0.5 * 0.75**2)


def test_model_graders_render_content_parts_for_the_judge():
    seen = []

    def judge(tier, messages, params):
        seen.append(messages)
        return '{"result": 0.9}'

    assert score(from_openai(SCORE_MODEL), ITEM, Sample(output_text="Mars"), judge=judge).total == 0.9
    assert seen[0][1]["content"] == [{"type": "input_text", "text": "Reference: Mars. Answer: Mars"}]
    label = score(from_openai(LABEL_MODEL), ITEM, Sample(output_text="Mars"), judge=lambda *args: "yes")
    assert label.total == 1.0


def test_flywheel_only_graders_do_not_export_and_each_place_is_named():
    spec = {
        "type": "multi",
        "graders": {"tests": {"type": "unit_tests"}, "exact": STRING_CHECK},
        "calculate_output": "tests + exact",
        "hacking_penalty": {"early_exit": 1},
    }
    with pytest.raises(OpenAIFormatError) as caught:
        to_openai(spec)
    assert [path for path, _ in caught.value.problems] == ["hacking_penalty", "graders.tests.type"]


def test_importing_json_that_is_not_an_openai_grader_is_refused():
    with pytest.raises(OpenAIFormatError) as caught:
        from_openai(
            {
                "type": "multi",
                "graders": {"a": {"type": "numeric"}, "b": {"type": "shiny"}},
                "calculate_output": "a",
            }
        )
    assert [message.split(";")[0] for _, message in caught.value.problems] == [
        "numeric graders are Flywheel's own",
        "shiny graders are not a grader type",
    ]
