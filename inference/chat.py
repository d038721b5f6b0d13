"""Chat prompts: task items and examples as the policy reads them, through its chat template.

A prompt is a string (the user's message, as most task items hold it) or a list of chat messages
(`{"role": "system" | "user" | "assistant", "content": str}`) ending with the user's turn. A tier
that chats renders it with the tokenizer's chat template and `add_generation_prompt`, so the model
writes the assistant's reply; a model without a template, or a tier with `chat` off, reads the raw
text. Training appends the end of the assistant turn the template writes (`turn_end_text`) to each
completion, so a trained policy learns to stop where the template ends a reply; only completion
tokens are ever targets.

Pure and light: no torch import, the tokenizer is used through its public methods.
"""

from collections.abc import Mapping
from typing import Any

ROLES = ("system", "user", "assistant")
MESSAGE_FIELDS = ("role", "content")
MAX_MESSAGES = 256
Message = dict[str, str]
Prompt = str | list[Message]
_MARK = "\u2063FLYWHEEL-REPLY\u2063"  # an invisible separator no tokenizer maps to a special token


def messages_problems(messages: Any, *, name: str = "messages") -> list[tuple[str, str]]:
    """Each problem of a chat prompt as (field, what is wrong); empty when it can be rendered.

    >>> messages_problems([{"role": "user", "content": "hi"}])
    []
    >>> messages_problems([{"role": "bot", "content": "hi"}])
    [('messages[0].role', "must be one of system, user, assistant; got 'bot'")]
    >>> messages_problems([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    [('messages', 'must end with a user message: the model writes the reply')]
    """
    if not isinstance(messages, list) or not messages:
        return [(name, "must be a non-empty list of {role, content} objects")]
    if len(messages) > MAX_MESSAGES:
        return [(name, f"at most {MAX_MESSAGES} messages")]
    problems: list[tuple[str, str]] = []
    for index, message in enumerate(messages):
        problems += _message_problems(f"{name}[{index}]", index, message)
    if not problems and messages[-1]["role"] != "user":
        problems.append((name, "must end with a user message: the model writes the reply"))
    return problems


def _message_problems(where: str, index: int, message: Any) -> list[tuple[str, str]]:
    if not isinstance(message, dict):
        return [(where, "must be an object with role and content")]
    problems = [
        (f"{where}.{key}", "unknown field (known: role, content)")
        for key in sorted(set(message) - set(MESSAGE_FIELDS), key=str)
    ]
    role = message.get("role")
    if role not in ROLES:
        problems.append((f"{where}.role", f"must be one of {', '.join(ROLES)}; got {role!r}"))
    elif role == "system" and index != 0:
        problems.append((f"{where}.role", "a system message may only come first"))
    content = message.get("content")
    if not isinstance(content, str) or not content.strip():
        problems.append((f"{where}.content", "must be a non-empty string"))
    return problems


def prompt_messages(prompt: Prompt) -> list[Message]:
    """A prompt as chat messages: a string is one user message.

    >>> prompt_messages("hi")
    [{'role': 'user', 'content': 'hi'}]
    """
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": message["role"], "content": message["content"]} for message in prompt]


def item_prompt(item: Mapping[str, Any]) -> Prompt:
    """A task item's prompt: its `messages` when it holds a conversation, else its `prompt`.

    >>> item_prompt({"prompt": "p"}), item_prompt({"messages": [{"role": "user", "content": "m"}]})
    ('p', [{'role': 'user', 'content': 'm'}])
    """
    messages = item.get("messages")
    return messages if messages else item["prompt"]


def prompt_summary(prompt: Prompt) -> str:
    """The text a prompt is searched and shown by: the string, or the last user message."""
    if isinstance(prompt, str):
        return prompt
    return next(m["content"] for m in reversed(prompt) if m["role"] == "user")


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_render(tokenizer: Any, prompt: Prompt, *, chat: bool = True) -> str:
    """The prompt as the policy reads it: through the chat template with the generation prompt
    when `chat` is on and the tokenizer has one; otherwise the raw text (`raw_render`)."""
    messages = prompt_messages(prompt)
    if chat and has_chat_template(tokenizer):
        return template_render(tokenizer, messages, add_generation_prompt=True)
    return raw_render(messages)


def raw_render(messages: list[Message]) -> str:
    """The raw text of a conversation for a model without a chat template: a lone user message as
    it is, otherwise each message's content followed by a blank line, the user's last.

    >>> raw_render([{"role": "user", "content": "hi"}])
    'hi'
    >>> raw_render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    'Be brief.\\n\\nhi'
    """
    return "\n\n".join(message["content"] for message in messages)


def template_text(
    tokenizer: Any, messages: list[dict[str, Any]], *, add_generation_prompt: bool, **options: Any
) -> str:
    """The chat template's text for `messages`: apply_chat_template without tokenizing (`options`,
    such as `tools`, are the template's own)."""
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **options
    )
    assert isinstance(text, str), "an untokenized template renders text"
    return text


def template_render(tokenizer: Any, messages: list[Message], *, add_generation_prompt: bool) -> str:
    """The chat template applied. A template that refuses a system role (Gemma's raises) gets the
    system text folded into the first user message, as those families' own docs recommend."""
    try:
        return template_text(tokenizer, messages, add_generation_prompt=add_generation_prompt)
    except Exception:  # noqa: BLE001  (jinja's TemplateError from `raise_exception`, any family)
        if not messages or messages[0]["role"] != "system" or len(messages) < 2:
            raise
    system, first, *rest = messages
    folded = {"role": first["role"], "content": f"{system['content']}\n\n{first['content']}"}
    return template_text(tokenizer, [folded, *rest], add_generation_prompt=add_generation_prompt)


def turn_end_text(tokenizer: Any, *, chat: bool = True) -> str:
    """What the chat template writes after an assistant reply, up to and including its end-of-turn
    token (`<|im_end|>` for ChatML, `<|eot_id|>` for Llama 3, `<end_of_turn>` for Gemma); the EOS
    token when there is no template or the template writes no special token after the reply.
    Training closes every completion with it, so the policy learns where a reply stops."""
    eos = tokenizer.eos_token or ""
    if not (chat and has_chat_template(tokenizer)):
        return eos
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARK}]
    try:
        rendered = template_render(tokenizer, conversation, add_generation_prompt=False)
    except Exception:  # noqa: BLE001  (a template that cannot render a reply: fall back to EOS)
        return eos
    if _MARK not in rendered:
        return eos
    after = rendered.split(_MARK, 1)[1]
    specials = [token for token in tokenizer.all_special_tokens if token and token in after]
    if not specials:
        return eos
    first = min(specials, key=after.index)
    return after[: after.index(first) + len(first)].lstrip(" ")


def completion_render(completion: str | list[Message]) -> str:
    """A completion's text: a string, or the assistant messages of TRL's conversational format."""
    if isinstance(completion, str):
        return completion
    return "".join(message["content"] for message in completion if message.get("role") == "assistant")
