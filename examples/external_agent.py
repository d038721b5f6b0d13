"""An agent of your own, trained by Flywheel: it takes episodes of a run of `external_rollouts`,
plays each against the run's newest policy through the official `openai` client (tools and a loop
of its own), and reports the final answer for the run's reward rule to score.

    pip install openai flywheel-client   # the client is client/ in this repository
    export FLYWHEEL_URL=http://127.0.0.1:8000 FLYWHEEL_TOKEN=<an API token>
    python examples/external_agent.py RUN_ID

Only two things tie it to Flywheel: the model name the episode names (`run-<id>`), and the episode
id sent with every call (the `X-Flywheel-Episode` header). Flywheel keeps each turn's sampled tokens
and log-probs, so the run learns on exactly what the model wrote, whatever the agent does with
the text; a tool's result is only ever read by the model, never trained on.
"""

import json
import os
import sys
import time
from typing import Any

import openai

from flywheel import Client
from flywheel.errors import ConflictError

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def task_messages(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The episode's task as a conversation: its messages, or its prompt as the user's turn."""
    return list(task.get("messages") or [{"role": "user", "content": task["prompt"]}])


def tool_result(call: Any) -> str:
    """Run one tool call of the model's (its arguments are untrusted text: parsed, checked)."""
    try:
        arguments = json.loads(call.function.arguments or "{}")
        if call.function.name != "add":
            return f"error: unknown tool {call.function.name!r}"
        return str(int(arguments["a"]) + int(arguments["b"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc}"


def play_episode(
    model: openai.OpenAI,
    episode: dict[str, Any],
    *,
    tools: list[dict] | None = None,
    max_turns: int = 4,
    max_tokens: int = 256,
) -> str:
    """Play one episode: ask, run the tools the model calls, ask again, until it answers."""
    messages = task_messages(episode["task"])
    offered = {"tools": tools} if tools else {}
    for _ in range(max_turns):
        answer = model.chat.completions.create(
            model=episode["model"],
            messages=messages,
            max_tokens=max_tokens,
            extra_headers={"X-Flywheel-Episode": episode["id"]},
            **offered,
        )
        message = answer.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": tool_result(call)})
    return ""


def main(run: int) -> None:
    flywheel = Client()
    model = openai.OpenAI(base_url=f"{flywheel.url}/v1", api_key=os.environ["FLYWHEEL_TOKEN"])
    while flywheel.runs.get(run)["status"] in ("queued", "running"):
        try:
            episode = flywheel.episodes.start(run)
        except ConflictError:  # every open episode is being played, or the learner is starting
            time.sleep(1)
            continue
        final = play_episode(model, episode, tools=[CALCULATOR])
        flywheel.episodes.report(run, episode["id"], final=final)


if __name__ == "__main__":
    main(int(sys.argv[1]))
