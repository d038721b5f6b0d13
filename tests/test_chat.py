"""Chat prompts: messages rendered with each family's template, raw prompts without one, the end of
a turn that training closes completions with, and items that hold a conversation."""

import json
from pathlib import Path

import pytest

from inference.chat import chat_render, item_prompt, messages_problems, turn_end_text
from inference.policy import policy_load
from inference.settings import TierSettings, tier_problems
from projects import services as project_services
from projects.models import TaskItem
from projects.task_format import validate_item
from tests.model_families import FAMILIES, family_model_save
from workers.learners.common import text_batch

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Write f(x)."},
]


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: family_model_save(name, root / name) for name in FAMILIES}


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        (
            "qwen2",
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWrite f(x).<|im_end|>\n"
            "<|im_start|>assistant\n",
        ),
        (
            "llama",
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWrite f(x).<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        # Mistral's and Gemma's templates refuse a system role: it is folded into the user's turn.
        ("mistral", "<s>[INST] Be brief.\n\nWrite f(x). [/INST]"),
        ("gemma", "<bos><start_of_turn>user\nBe brief.\n\nWrite f(x).<end_of_turn>\n<start_of_turn>model\n"),
        ("phi3", "<|system|>\nBe brief.<|end|>\n<|user|>\nWrite f(x).<|end|>\n<|assistant|>\n"),
        # No template: the raw text.
        ("gpt_neox", "Be brief.\n\nWrite f(x)."),
        ("gpt2", "Be brief.\n\nWrite f(x)."),
    ],
)
def test_messages_render_with_the_familys_template_and_generation_prompt(family_dirs, family, expected):
    policy = policy_load(family_dirs[family])
    assert policy.prompt_text(CONVERSATION) == expected


def test_a_string_prompt_is_one_user_message_and_a_tier_without_chat_reads_it_raw(family_dirs):
    policy = policy_load(family_dirs["qwen2"])
    assert policy.prompt_text("Hi") == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    policy.chat = False
    assert policy.prompt_text("Hi") == "Hi"
    assert policy.prompt_text(CONVERSATION) == "Be brief.\n\nWrite f(x)."


@pytest.mark.parametrize(
    ("family", "end"),
    [
        ("qwen2", "<|im_end|>"),
        ("llama", "<|eot_id|>"),
        ("mistral", "</s>"),
        ("gemma", "<end_of_turn>"),
        ("phi3", "<|end|>"),
        ("gpt2", "<|endoftext|>"),
    ],
)
def test_training_closes_a_completion_with_the_templates_end_of_turn(family_dirs, family, end):
    policy = policy_load(family_dirs[family])
    assert turn_end_text(policy.tokenizer) == end
    prompt = chat_render(policy.tokenizer, "Write f(x).")
    batch = text_batch(policy.tokenizer, [prompt], ["return 1"])
    completion = batch.input_ids[0][batch.completion_mask[0].bool()].tolist()
    # Only the completion and its end of turn are targets; the prompt is context.
    assert policy.tokenizer.decode(completion) == "return 1" + end
    assert int(batch.completion_mask.sum()) == len(completion)


def test_tokenizer_config_holds_the_template_as_hub_checkpoints_do(family_dirs):
    config = json.loads((family_dirs["gemma"] / "tokenizer_config.json").read_text())
    assert config["chat_template"].startswith("{{ bos_token }}")
    assert "chat_template" not in json.loads((family_dirs["gpt2"] / "tokenizer_config.json").read_text())


def test_message_problems_name_the_message_and_field():
    assert messages_problems("hi") == [("messages", "must be a non-empty list of {role, content} objects")]
    assert messages_problems(
        [
            {"role": "user", "content": "a", "name": "x"},
            {"role": "system", "content": "b"},
            {"role": "user", "content": ""},
            "text",
        ]
    ) == [
        ("messages[0].name", "unknown field (known: role, content)"),
        ("messages[1].role", "a system message may only come first"),
        ("messages[2].content", "must be a non-empty string"),
        ("messages[3]", "must be an object with role and content"),
    ]


def test_an_item_may_hold_messages_instead_of_a_prompt():
    messages = [*CONVERSATION, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "Now g."}]
    item, errors = validate_item(4, {"kind": "answer", "messages": messages, "reference": "g"})
    assert errors == []
    assert item.text == "Now g."  # the searchable text: the last user message
    assert item.data == {"messages": messages, "reference": "g"}
    assert item_prompt(item.data) == messages


def test_bad_messages_are_refused_with_line_and_field():
    _, errors = validate_item(
        7, {"kind": "code", "messages": [{"role": "bot", "content": "x"}], "tests": "t", "entry_point": "f"}
    )
    assert [str(error) for error in errors] == [
        "line 7, field 'messages[0].role': must be one of system, user, assistant; got 'bot'"
    ]
    _, errors = validate_item(2, {"messages": CONVERSATION, "prompt": "p", "reference": "r"})
    assert [str(error) for error in errors] == [
        "line 2, field 'messages': give either prompt or messages, not both"
    ]
    _, errors = validate_item(3, {"messages": [{"role": "assistant", "content": "x"}], "reference": "r"})
    assert [str(error) for error in errors] == [
        "line 3, field 'messages': must end with a user message: the model writes the reply"
    ]
    _, errors = validate_item(5, {"reference": "r"})
    assert [str(error) for error in errors] == [
        "line 5, field 'prompt': is required for an answer item (or give messages, a conversation)"
    ]


def test_a_task_set_imports_conversations_and_exports_them_back(team):
    owner, project = team["owner"], team["project"]
    task_set = project_services.task_set_create(project=project, name="chats", by=owner)
    line = {"id": "c1", "kind": "answer", "split": "train", "messages": CONVERSATION, "reference": "f"}
    project_services.task_set_import(
        task_set=task_set, stream=[json.dumps(line).encode()], file_format="jsonl", by=owner
    )
    stored = TaskItem.objects.get(external_id="c1")
    assert (stored.text, stored.data["messages"]) == ("Write f(x).", CONVERSATION)


def test_a_tier_says_whether_it_chats():
    assert TierSettings.from_config({"base_model": "./m"}).chat is True
    assert TierSettings.from_config({"base_model": "./m", "chat": False}).chat is False
    assert tier_problems({"base_model": "./m", "chat": "yes"}) == {
        "chat": "must be true (render prompts with the chat template) or false (raw prompts)"
    }


def test_the_tier_form_offers_chat_checked_and_the_tier_page_shows_it(client, team, tmp_path):
    from django.urls import reverse

    from core.roles import Role
    from tiers.models import Tier

    client.force_login(team[Role.OWNER])
    form = client.get(reverse("tier-create", args=[team["project"].pk])).content.decode()
    assert 'type="checkbox" name="chat"' in form and "checked" in form.split('name="chat"')[1].split(">")[0]
    values = {
        "name": "raw",
        "base_model": str(tmp_path),
        "device": "cpu",
        "precision": "fp32",
        "speculation": "none",
        "speculative_tokens": "0",
        "temperature": "1",
        "top_p": "1",
        "top_k": "0",
        "max_new_tokens": "8",
        "batch_size": "4",
    }  # chat left unchecked
    response = client.post(reverse("tier-create", args=[team["project"].pk]), values)
    assert response.status_code == 302, response.content.decode()[-2000:]
    tier = Tier.objects.get(name="raw")
    assert tier.chat is False
    page = client.get(reverse("tier-detail", args=[tier.pk])).content.decode()
    assert "<dt>Chat template</dt><dd>off: raw prompts</dd>" in page
