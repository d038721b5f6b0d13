"""Multi-step agent episodes: the policy acts in a sandbox, one shell command a turn, until it
submits or spends the item's step budget; the item's check command then grades the workspace.

The protocol is plain text, so any causal LM can play it. Each turn the policy sees the item's
instructions and the transcript so far (older turns dropped first when the context is short),
ending in a shell prompt `$ `. Its completion is the action: the first fenced code block if there
is one, else the first line. `submit` (or an empty action) ends the episode. The command runs in
the episode's own sandbox; its exit status and output (capped) are the next observation.

Episodes of a batch advance together, one batched generation a turn, as many at once as the
sandbox pool lends sandboxes. Model output is untrusted: it only ever runs inside the sandbox.
"""

import re
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

from inference.generation import Completion
from rewards.engine import Sample, ScoreResult, score
from rewards.graders.base import GraderError
from sandboxes.interface import ExecResult, InfrastructureError, Limits, task_spec
from sandboxes.services import sandbox_acquire, sandbox_pool

SUBMIT = "submit"
COMMAND_SECONDS = 5.0
OBSERVATION_CHARS = 400  # of each command's output, in the transcript the policy sees
RECORD_CHARS = 4000  # of each command's output, in the trajectory's record
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.DOTALL)
LIMITS = Limits(wall_seconds=COMMAND_SECONDS, cpu_seconds=COMMAND_SECONDS)

Generate = Callable[[list[str]], list[Completion]]


@dataclass
class Turn:
    observation: str  # the prompt the policy saw, before its chat template
    completion: Completion
    command: str | None  # None: it submitted
    result: ExecResult | None = None

    def record(self) -> dict:
        """The turn as a trajectory step stores it (the replay's observation / action / result)."""
        data = {
            "observation": self.observation,
            "action": self.completion.text,
            "command": self.command,
            "prompt_token_ids": self.completion.prompt_token_ids,
            "token_ids": self.completion.token_ids,
            "logprobs": self.completion.logprobs,
            "finish_reason": self.completion.finish_reason,
        }
        if self.result is not None:
            data["tool_result"] = {
                "exit_code": self.result.exit_code,
                "stop_reason": str(self.result.stop_reason),
                "stdout": self.result.stdout[:RECORD_CHARS],
                "stderr": self.result.stderr[:RECORD_CHARS],
                "wall_seconds": round(self.result.wall_seconds, 4),
                "cpu_seconds": round(self.result.cpu_seconds, 4),
            }
        return data


@dataclass
class AgentEpisode:
    item: dict
    turns: list[Turn] = field(default_factory=list)
    submitted: bool = False
    error: str | None = None  # the infrastructure failed; the episode is errored
    grade: ScoreResult | None = None
    seconds: float = 0.0  # wall time, acting and graded

    @property
    def done(self) -> bool:
        return self.submitted or self.error is not None or len(self.turns) >= int(self.item["max_steps"])

    @property
    def cpu_seconds(self) -> float:
        return sum(turn.result.cpu_seconds for turn in self.turns if turn.result is not None)

    def sample(self) -> Sample:
        """What the reward rule sees: the last action as text and every step, for trajectory checks."""
        steps = [
            {"kind": "command", "valid": turn.command is not None, "exit_code": turn.result.exit_code}
            for turn in self.turns
            if turn.result is not None
        ]
        last = self.turns[-1].completion.text if self.turns else ""
        return Sample(
            output_text=last, steps=steps, tokens=sum(len(t.completion.token_ids) for t in self.turns)
        )


def action_command(text: str) -> str | None:
    """The shell command in a completion, or None when the policy submits.

    >>> action_command("```sh\\necho hi > a.txt\\n```"), action_command("ls -l\\nmore")
    ('echo hi > a.txt', 'ls -l')
    >>> action_command(" submit"), action_command("")
    (None, None)
    """
    fenced = FENCE.search(text)
    command = (fenced.group(1) if fenced else text.strip().split("\n", 1)[0]).strip()
    return None if command in ("", SUBMIT) else command


def transcript_line(turn: Turn) -> str:
    if turn.result is None:
        return f"$ {SUBMIT}\n"
    output = (turn.result.stdout + turn.result.stderr)[-OBSERVATION_CHARS:]
    return (
        f"$ {turn.command}\n{output}"
        + ("" if output.endswith("\n") or not output else "\n")
        + (f"[exit {turn.result.exit_code}]\n")
    )


def context_fits(policy, max_new_tokens: int) -> Callable[[str], bool]:
    """Whether an observation, through the policy's chat template, leaves room to answer."""
    budget = policy.max_context - int(max_new_tokens)
    return lambda text: len(policy.tokenizer(policy.prompt_text(text))["input_ids"]) <= budget


def observation(episode: AgentEpisode, fits: Callable[[str], bool]) -> str:
    """Instructions, then as much of the transcript as fits (the newest turns), then `$ `."""
    head = f"{episode.item['instructions'].rstrip()}\nRun one shell command per turn; `{SUBMIT}` when done.\n"
    lines = [transcript_line(turn) for turn in episode.turns]
    while lines and not fits(head + "".join(lines) + "$ "):
        lines.pop(0)
    return head + "".join(lines) + "$ "


def episodes_play(
    items: list[dict],
    generate: Generate,
    *,
    rule: dict,
    prompt_text: Callable[[str], str] = lambda text: text,
    fits: Callable[[str], bool] = lambda text: True,
    judge=None,
    on_done: Callable[[int, list[AgentEpisode]], None] | None = None,
) -> list[AgentEpisode]:
    """Play one episode per item (repeat an item for a group) and grade each with `rule`; waves
    one smaller than the sandbox pool. `on_done(first item's index, wave)` gets each wave as it
    finishes, to store it early."""
    # One sandbox stays free for graders that need a fresh one (the episodes' own are all held).
    wave = max(1, sandbox_pool().max_sandboxes - 1)
    episodes: list[AgentEpisode] = []
    for start in range(0, len(items), wave):
        played = _wave_play(items[start : start + wave], generate, rule, prompt_text, fits, judge)
        if on_done is not None:
            on_done(start, played)
        episodes += played
    return episodes


def _wave_play(items, generate: Generate, rule: dict, prompt_text, fits, judge) -> list[AgentEpisode]:
    started = time.monotonic()
    episodes = [AgentEpisode(item) for item in items]
    with ExitStack() as stack:
        specs = [task_spec(item.get("files") or {}, LIMITS, item.get("sandbox")) for item in items]
        sandboxes = [stack.enter_context(sandbox_acquire(spec)) for spec in specs]
        while live := [index for index, episode in enumerate(episodes) if not episode.done]:
            observations = [observation(episodes[index], fits) for index in live]
            completions = generate([prompt_text(text) for text in observations])
            for index, seen, completion in zip(live, observations, completions, strict=True):
                _act(
                    episodes[index], sandboxes[index], Turn(seen, completion, action_command(completion.text))
                )
        for episode, sandbox in zip(episodes, sandboxes, strict=True):
            episode.grade = _grade(episode, sandbox, rule, judge)
    for episode in episodes:  # a wave's episodes play side by side: each took the wave's time
        episode.seconds = time.monotonic() - started
    return episodes


def _act(episode: AgentEpisode, sandbox, turn: Turn) -> None:
    episode.turns.append(turn)
    if turn.command is None:
        episode.submitted = True
        return
    try:
        turn.result = sandbox.exec(turn.command)  # the item's wall_seconds if it asks, else COMMAND_SECONDS
    except InfrastructureError as exc:  # the machinery failed, not the policy: the episode is errored
        episode.error = f"the sandbox failed at turn {len(episode.turns)}: {exc}"


def _grade(episode: AgentEpisode, sandbox, rule: dict, judge) -> ScoreResult:
    if episode.error is not None:
        return ScoreResult(total=None, errors=[GraderError("", "sandbox_error", episode.error)], errored=True)
    item = {key: value for key, value in episode.item.items() if key != "pk"}
    return score(rule, item, episode.sample(), judge=judge, sandbox=sandbox)
