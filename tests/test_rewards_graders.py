"""Every in-process grader kind through the engine, with exact rewards."""

import pytest

from rewards.engine import Sample, score

ANSWER = {
    "id": "a1",
    "kind": "answer",
    "split": "train",
    "prompt": "Capital of France?",
    "reference": "Paris",
}
OUTPUT = "{{ sample.output_text }}"


def check(operation: str, output: str, reference: str = "{{ item.reference }}") -> float:
    rule = {
        "type": "string_check",
        "name": "check",
        "input": OUTPUT,
        "reference": reference,
        "operation": operation,
    }
    return score(rule, ANSWER, Sample(output_text=output)).total


def test_string_check_eq_and_ne_compare_exactly():
    assert [check("eq", "Paris"), check("eq", "paris"), check("ne", "paris"), check("ne", "Paris")] == [
        1.0,
        0.0,
        1.0,
        0.0,
    ]


def test_string_check_like_is_a_substring_check_and_ilike_ignores_case():
    assert [check("like", "It is Paris."), check("like", "it is paris."), check("ilike", "it is PARIS.")] == [
        1.0,
        0.0,
        1.0,
    ]


def similarity(metric: str, output: str, reference: str) -> float:
    rule = {
        "type": "text_similarity",
        "name": "sim",
        "input": OUTPUT,
        "reference": reference,
        "evaluation_metric": metric,
    }
    return score(rule, ANSWER, Sample(output_text=output)).total


def test_fuzzy_match_is_rapidfuzz_wratio_on_a_unit_scale():
    assert similarity("fuzzy_match", "hello world", "hello world") == 1.0
    assert similarity("fuzzy_match", "hello wrld", "hello world") == pytest.approx(
        20 / 21
    )  # 2 * 10 matches / 21 chars


def test_bleu_is_the_geometric_mean_of_ngram_precisions():
    # precisions 5/6, 3/5, 2/4, 1/3 and no brevity penalty
    assert similarity("bleu", "the cat sat on a mat", "the cat sat on the mat") == pytest.approx(
        (1 / 12) ** 0.25
    )
    assert similarity("bleu", "the cat sat on the mat", "the cat sat on the mat") == 1.0


def test_gleu_is_the_smaller_of_ngram_precision_and_recall():
    assert similarity("gleu", "the cat sat on a mat", "the cat sat on the mat") == pytest.approx(11 / 18)


def test_rouge_scores_are_f_measures():
    assert similarity("rouge_1", "the cat sat", "the cat sat down") == pytest.approx(6 / 7)  # P 3/4, R 1
    assert similarity("rouge_2", "the cat sat", "the cat sat down") == pytest.approx(4 / 5)  # P 2/2, R 2/3
    assert similarity("rouge_l", "cat the sat", "the cat sat") == pytest.approx(2 / 3)


def test_meteor_matches_words_without_wordnet():
    # P = R = 1 with one chunk of three matches: penalty 0.5 * (1/3)^3
    assert similarity("meteor", "the cat sat", "the cat sat") == pytest.approx(1 - 0.5 / 27)


def test_cosine_without_an_embedding_model_is_an_unsupported_error(monkeypatch):
    monkeypatch.delenv("FLYWHEEL_EMBEDDING_MODEL", raising=False)
    rule = {
        "type": "text_similarity",
        "name": "sim",
        "input": OUTPUT,
        "reference": "x",
        "evaluation_metric": "cosine",
    }
    result = score(rule, ANSWER, Sample(output_text="x"))
    assert (result.total, result.components, result.errored) == (None, {"sim": None}, False)
    assert [(error.grader, error.kind) for error in result.errors] == [("sim", "unsupported")]
    assert "FLYWHEEL_EMBEDDING_MODEL" in result.errors[0].message


def numeric(output: str, **options) -> float:
    rule = {"type": "numeric", "name": "n", "input": OUTPUT, "reference": "{{ item.reference }}", **options}
    return score(rule, {**ANSWER, "reference": "3.14159"}, Sample(output_text=output)).total


def test_numeric_compares_the_stated_number_within_tolerance():
    assert numeric("3.14159") == 1.0
    assert numeric("3.14") == 0.0
    assert numeric("so it is 3.14", tolerance=0.01) == 1.0
    assert numeric("3.2", tolerance=0.01) == 0.0
    assert numeric("3.3", relative_tolerance=0.05) == 1.0
    assert numeric("no number here", tolerance=1) == 0.0


def test_numeric_with_a_reference_that_is_no_number_is_a_grader_error():
    rule = {"type": "numeric", "name": "n", "input": OUTPUT, "reference": "{{ item.reference }}"}
    result = score(rule, ANSWER, Sample(output_text="3"))
    assert (result.total, result.errors[0].kind) == (None, "grader_exception")


def regex(output: str, pattern: str, **options) -> float:
    rule = {"type": "regex", "name": "r", "input": OUTPUT, "pattern": pattern, **options}
    return score(rule, ANSWER, Sample(output_text=output)).total


def test_regex_searches_or_matches_the_whole_text():
    assert regex("Answer: 42", r"Answer: \d+") == 1.0
    assert regex("Answer: 42", r"\d+", mode="fullmatch") == 0.0
    assert regex("42", r"\d+", mode="fullmatch") == 1.0
    assert regex("ANSWER", "answer") == 0.0
    assert regex("ANSWER", "answer", flags=["IGNORECASE"]) == 1.0


def test_a_pattern_that_backtracks_forever_is_stopped_and_reported():
    result = score(
        {"type": "regex", "name": "r", "input": OUTPUT, "pattern": r"^(a|aa)+$"},
        ANSWER,
        Sample(output_text="a" * 60 + "!"),
    )
    assert (result.total, result.errors[0].kind) == (None, "grader_exception")
    assert "ran past" in result.errors[0].message


SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


def test_json_schema_checks_output_json_then_output_text_then_a_templated_input():
    rule = {"type": "json_schema", "name": "j", "schema": SCHEMA}
    assert score(rule, ANSWER, Sample(output_json={"answer": 4})).total == 1.0
    assert score(rule, ANSWER, Sample(output_json={"answer": "4"})).total == 0.0
    assert score(rule, ANSWER, Sample(output_text='{"answer": 4}')).total == 1.0
    assert score(rule, ANSWER, Sample(output_text="four")).total == 0.0
    templated = {**rule, "input": "{{ sample.metadata.raw }}"}
    assert score(templated, ANSWER, Sample(metadata={"raw": '{"answer": 1}'})).total == 1.0


STEPS = [
    {"action": "ls", "kind": "command", "valid": True, "format_ok": True, "tokens": 5, "observation": "a.py"},
    {
        "action": "cat b.py",
        "kind": "command",
        "valid": False,
        "format_ok": True,
        "tokens": 7,
        "observation": "no file",
    },
    {
        "action": "<tool",
        "kind": "tool_call",
        "valid": False,
        "format_ok": False,
        "tokens": 3,
        "observation": "",
    },
    {"action": "done", "kind": "message", "valid": True, "format_ok": True, "tokens": 2, "observation": ""},
]


def trajectory(type_name: str, sample: Sample, **options) -> float:
    return score({"type": type_name, **options}, ANSWER, sample).total


def test_trajectory_checks_count_invalid_actions_format_errors_steps_and_tokens():
    sample = Sample(steps=STEPS)
    assert trajectory("invalid_actions", sample) == 2.0
    assert trajectory("invalid_actions", sample, kinds=["tool_call"]) == 1.0
    assert trajectory("format_errors", sample) == 1.0
    assert trajectory("steps", sample) == 4.0
    assert trajectory("tokens_used", sample) == 17.0
    assert trajectory("tokens_used", Sample(steps=STEPS, tokens=40)) == 40.0


def judge_saying(reply: str, seen: list | None = None):
    def judge(tier: str, messages: list[dict], params: dict) -> str:
        if seen is not None:
            seen.append((tier, messages, params))
        return reply

    return judge


SCORE_MODEL = {
    "type": "score_model",
    "name": "judge",
    "model": "tier:judge-small",
    "input": [
        {"role": "system", "content": "Grade the answer from 0 to 10."},
        {"role": "user", "content": "Question: {{ item.prompt }}\nAnswer: {{ sample.output_text }}"},
    ],
    "range": [0, 10],
    "sampling_params": {"temperature": 0},
}


def test_score_model_renders_the_prompt_and_parses_the_judges_score():
    seen: list = []
    result = score(
        SCORE_MODEL, ANSWER, Sample(output_text="Paris"), judge=judge_saying('{"result": 7.5}', seen)
    )
    assert (result.total, result.components, result.errors) == (7.5, {"judge": 7.5}, [])
    tier, messages, params = seen[0]
    assert (tier, params) == ("tier:judge-small", {"temperature": 0})
    assert messages[1] == {"role": "user", "content": "Question: Capital of France?\nAnswer: Paris"}
    assert messages[-1] == {
        "role": "system",
        "content": 'Reply with JSON {"result": <a number from 0 to 10>}.',
    }


def test_score_model_takes_the_last_number_of_a_plain_reply_and_refuses_one_out_of_range():
    plain = score(
        SCORE_MODEL, ANSWER, Sample(output_text="Paris"), judge=judge_saying("Reasoning... final score: 8")
    )
    assert plain.total == 8.0
    outside = score(SCORE_MODEL, ANSWER, Sample(output_text="Paris"), judge=judge_saying("42"))
    assert (outside.total, outside.errored, outside.errors[0].kind) == (None, False, "invalid_output")


def test_a_model_grader_without_a_judge_is_an_errored_judge_error():
    result = score(SCORE_MODEL, ANSWER, Sample(output_text="Paris"))
    assert (result.total, result.errored, result.components) == (None, True, {"judge": None})
    assert [(error.kind, error.message) for error in result.errors] == [
        ("judge_error", "no judge configured")
    ]


def test_a_judge_that_raises_makes_the_sample_errored():
    def broken(tier, messages, params):
        raise ConnectionError("tier offline")

    result = score(SCORE_MODEL, ANSWER, Sample(output_text="Paris"), judge=broken)
    assert (result.total, result.errored, result.errors[0].kind) == (None, True, "judge_error")
    assert "tier offline" in result.errors[0].message


LABEL_MODEL = {
    "type": "label_model",
    "name": "verdict",
    "model": "tier:judge-small",
    "input": [{"role": "user", "content": "Is '{{ sample.output_text }}' the answer to {{ item.prompt }}?"}],
    "labels": ["correct", "incorrect"],
    "passing_labels": ["correct"],
}


def test_label_model_passes_on_a_passing_label_only():
    assert (
        score(
            LABEL_MODEL, ANSWER, Sample(output_text="Paris"), judge=judge_saying('{"result": "correct"}')
        ).total
        == 1.0
    )
    assert (
        score(LABEL_MODEL, ANSWER, Sample(output_text="Lyon"), judge=judge_saying("Incorrect.")).total == 0.0
    )
    unknown = score(LABEL_MODEL, ANSWER, Sample(output_text="Lyon"), judge=judge_saying("maybe"))
    assert (unknown.total, unknown.errors[0].kind) == (None, "invalid_output")
