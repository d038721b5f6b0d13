"""tinker-cookbook's loops on Flywheel's tasks and reward rules.

Importing this module registers the renderer `chat_template` with the cookbook: it renders through
the model's own Hugging Face chat template, so a loop can train any model Flywheel serves, not
only the families the cookbook names. `TaskSetRLDatasetBuilder` is a cookbook RL dataset of a
Flywheel task set version: one group of episodes per item, scored by a Flywheel reward rule
version on the server (sandboxed unit tests, string checks, judges: whatever the rule runs), with
the set's held-out split as the cookbook's test set.

    import flywheel.cookbook
    from tinker_cookbook.rl import train

    builder = flywheel.cookbook.TaskSetRLDatasetBuilder(
        task_set_version=12, reward_rule=3, model_name_for_tokenizer=model,
        renderer_name="chat_template", batch_size=8, group_size=8,
    )
    asyncio.run(train.main(train.Config(dataset_builder=builder, base_url=f"{url}/tinker", ...)))

It needs `tinker-cookbook` (`pip install flywheel-client[cookbook]`); FLYWHEEL_URL and
FLYWHEEL_TOKEN say which server and who (the token needs the rule's project's edit role: scoring
runs graders).
"""

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import chz
import tinker
import torch
from tinker_cookbook import renderers
from tinker_cookbook.renderers import Message, ParseTermination, RenderContext, Renderer, TrainOnWhat
from tinker_cookbook.renderers.base import RenderedMessage
from tinker_cookbook.rl.types import (
    Action,
    ActionExtra,
    Env,
    EnvGroupBuilder,
    Metrics,
    Observation,
    RLDataset,
    RLDatasetBuilder,
    StepResult,
    StopCondition,
    Trajectory,
)
from tinker_cookbook.tokenizer_utils import Tokenizer, get_tokenizer

from flywheel.client import Client

CHAT_TEMPLATE_RENDERER = "chat_template"
# The dry-run endpoint scores at most this many pairs a call.
SCORE_BATCH = 500


class ChatTemplateRenderer(Renderer):
    """Whole conversations through the tokenizer's chat template; sampling stops at its EOS.

    A template may rewrite earlier turns (drop reasoning, add a default system prompt), so this
    renderer never assumes one conversation's tokens extend another's: a supervised example is the
    template's render of the conversation, trained after the render of its prompt, and refused
    when the prompt's render is not a prefix of it."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"the tokenizer of {tokenizer.name_or_path!r} has no chat template: "
                "use one of the cookbook's named renderers (role_colon for a base model)"
            )
        if tokenizer.eos_token_id is None:
            raise ValueError(f"the tokenizer of {tokenizer.name_or_path!r} has no EOS token to stop at")

    def _tokens(self, messages: list[Message], *, add_generation_prompt: bool) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [{"role": m["role"], "content": renderers.get_text_content(m)} for m in messages],
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def get_stop_sequences(self) -> list[int]:
        return [self.tokenizer.eos_token_id]

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        raise NotImplementedError(
            "the chat_template renderer renders whole conversations (build_generation_prompt, "
            "build_supervised_example), not single messages"
        )

    def build_generation_prompt(
        self, messages: list[Message], role: renderers.Role = "assistant", prefill: str | None = None
    ) -> tinker.ModelInput:
        if role != "assistant":
            raise ValueError(f"a chat template prompts only the assistant; got role {role!r}")
        tokens = self._tokens(messages, add_generation_prompt=True)
        if prefill:
            tokens += self.tokenizer.encode(prefill, add_special_tokens=False)
        return tinker.ModelInput.from_ints(tokens)

    def build_supervised_example(
        self, messages: list[Message], train_on_what: TrainOnWhat = TrainOnWhat.LAST_ASSISTANT_MESSAGE
    ) -> tuple[tinker.ModelInput, torch.Tensor]:
        if train_on_what not in (TrainOnWhat.LAST_ASSISTANT_MESSAGE, TrainOnWhat.LAST_ASSISTANT_TURN):
            raise NotImplementedError(
                f"the chat_template renderer trains the last assistant message only, not {train_on_what}"
            )
        if not messages or messages[-1]["role"] != "assistant":
            raise ValueError("a supervised example must end with an assistant message")
        prompt = self._tokens(messages[:-1], add_generation_prompt=True)
        whole = self._tokens(messages, add_generation_prompt=False)
        if whole[: len(prompt)] != prompt:
            raise ValueError(
                f"the chat template of {self.tokenizer.name_or_path!r} renders the conversation's "
                "prompt differently inside the whole conversation: no prefix to train after"
            )
        weights = torch.zeros(len(whole))
        weights[len(prompt) :] = 1.0
        return tinker.ModelInput.from_ints(whole), weights

    def parse_response(self, response: list[int]) -> tuple[Message, ParseTermination]:
        stopped = bool(response) and response[-1] == self.tokenizer.eos_token_id
        tokens = response[:-1] if stopped else response
        content = self.tokenizer.decode(tokens, skip_special_tokens=True)
        assert isinstance(content, str)  # one sequence decodes to one string (a batch, to a list)
        termination = ParseTermination.STOP_SEQUENCE if stopped else ParseTermination.MALFORMED
        return Message(role="assistant", content=content), termination


def _chat_template_renderer(tokenizer: Tokenizer, image_processor: Any = None) -> Renderer:
    return ChatTemplateRenderer(tokenizer)  # text only: the image processor is not used


renderers.register_renderer(CHAT_TEMPLATE_RENDERER, _chat_template_renderer)


@cache
def _client(url: str | None) -> Client:
    return Client(url=url)


@dataclass(frozen=True)
class RuleScorer:
    """A reward rule version scoring completions of one task set version's items, on the server."""

    reward_rule: int
    version: int
    task_set_version: int
    url: str | None = None

    def score(self, item_id: str, completions: list[str]) -> list[dict[str, Any]]:
        """Each completion's score result ({total, components, errored, flags, ...}), in order."""
        results: list[dict[str, Any]] = []
        for start in range(0, len(completions), SCORE_BATCH):
            batch = completions[start : start + SCORE_BATCH]
            answer = _client(self.url).reward_rules.dry_run(
                self.reward_rule,
                version=self.version,
                task_set_version=self.task_set_version,
                item_ids=[item_id] * len(batch),
                samples=batch,
            )
            results += [dict(pair["result"]) for pair in answer["results"]]
        return results


def group_rewards(results: list[dict[str, Any]]) -> list[tuple[float, Metrics]]:
    """Rewards for a group from its score results. An errored score (the grader's infrastructure
    failed, not the completion) gets the mean of the group's scored ones: centred on the group,
    as the cookbook's advantages are, it teaches nothing either way, as Flywheel masks it in its
    own runs. A group with nothing scored is an error, for the loop's rollout strategy to handle."""
    scored = [r["total"] for r in results if not r["errored"] and r["total"] is not None]
    if not scored:
        reasons = sorted({e["message"] for r in results for e in r["errors"]})[:3]
        raise RuntimeError(f"the reward rule scored none of the group: {'; '.join(reasons) or 'no total'}")
    mean = sum(scored) / len(scored)
    rewards = []
    for result in results:
        errored = result["errored"] or result["total"] is None
        metrics = {"flywheel/errored": float(errored), "flywheel/flagged": float(bool(result["flags"]))}
        metrics |= {
            f"flywheel/{name}": value for name, value in result["components"].items() if value is not None
        }
        rewards.append((mean if errored else float(result["total"]), metrics))
    return rewards


class TaskEnv(Env):
    """One single-turn episode of an item: its prompt, one completion, scored with its group."""

    def __init__(self, renderer: Renderer, messages: list[Message]) -> None:
        self.renderer = renderer
        self.messages = messages
        self.completion = ""

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return self.renderer.build_generation_prompt(self.messages), self.renderer.get_stop_sequences()

    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        message, termination = self.renderer.parse_response(action)
        self.completion = renderers.get_text_content(message)
        return StepResult(
            reward=0.0,  # the rule scores the group at once (compute_group_rewards)
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=self.renderer.get_stop_sequences(),
            metrics={"stopped": float(termination.is_clean)},
        )


@dataclass(frozen=True)
class TaskGroupBuilder(EnvGroupBuilder):
    item_id: str
    messages: list[Message]
    renderer: Renderer
    scorer: RuleScorer
    group_size: int
    tag: str = "flywheel"

    async def make_envs(self) -> Sequence[Env]:
        return [TaskEnv(self.renderer, self.messages) for _ in range(self.group_size)]

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        completions = [env.completion for env in env_group if isinstance(env, TaskEnv)]
        results = await asyncio.to_thread(self.scorer.score, self.item_id, completions)
        return group_rewards(results)

    def logging_tags(self) -> list[str]:
        return [self.tag]


@dataclass
class TaskSetRLDataset(RLDataset):
    builders: list[TaskGroupBuilder]
    batch_size: int = field(default=1)

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return self.builders[index * self.batch_size : (index + 1) * self.batch_size]

    def __len__(self) -> int:
        return len(self.builders) // self.batch_size


def item_messages(item: dict[str, Any]) -> list[Message]:
    """A task item's prompt as chat messages: its conversation, else its prompt as one user turn."""
    data = item["data"]
    if data.get("messages"):
        return [Message(role=m["role"], content=m["content"]) for m in data["messages"]]
    return [Message(role="user", content=data["prompt"])]


@chz.chz
class TaskSetRLDatasetBuilder(RLDatasetBuilder):
    """The cookbook's RL dataset of a Flywheel task set version scored by a reward rule.

    Each step takes `batch_size` training items (shuffled by `seed`), `group_size` episodes each;
    the `test_split` items (`None`: no test set) are the cookbook's test set, `test_group_size`
    episodes each. `reward_rule_version` defaults to the rule's latest at the start, kept for the
    whole loop."""

    task_set_version: int
    reward_rule: int
    model_name_for_tokenizer: str
    renderer_name: str
    batch_size: int
    group_size: int
    reward_rule_version: int | None = None
    train_split: str = "train"
    test_split: str | None = "heldout"
    test_group_size: int = 4
    seed: int = 0
    flywheel_url: str | None = None

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return await asyncio.to_thread(self._build)

    def _build(self) -> tuple[RLDataset, RLDataset | None]:
        client = _client(self.flywheel_url)
        version = self.reward_rule_version or max(
            v["number"] for v in client.reward_rules.versions(self.reward_rule)
        )
        scorer = RuleScorer(self.reward_rule, version, self.task_set_version, self.flywheel_url)
        renderer = renderers.get_renderer(
            self.renderer_name,
            get_tokenizer(self.model_name_for_tokenizer),
            model_name=self.model_name_for_tokenizer,
        )

        def groups(split: str, group_size: int) -> list[TaskGroupBuilder]:
            items = list(client.tasks.list(version=self.task_set_version, split=split))
            if not items:
                raise ValueError(f"task set version {self.task_set_version} has no {split!r} items")
            return [
                TaskGroupBuilder(
                    item["external_id"], item_messages(item), renderer, scorer, group_size, split
                )
                for item in items
            ]

        train = groups(self.train_split, self.group_size)
        random.Random(self.seed).shuffle(train)
        if len(train) < self.batch_size:
            raise ValueError(
                f"batch_size {self.batch_size} is more than the {len(train)} {self.train_split!r} items"
            )
        test = (
            None
            if self.test_split is None
            else TaskSetRLDataset(groups(self.test_split, self.test_group_size))
        )
        return TaskSetRLDataset(train, self.batch_size), test
