"""tinker-cookbook's supervised loop, unmodified, against a live Flywheel: `supervised.train` with
its `FromConversationFileBuilder` on the cookbook's own example conversations, changed only in its
base_url, the model (the tests' tiny base) and the renderer (`role_colon`: no hub tokenizer). The
loss it logs falls; its final checkpoints are the run's, by name."""

import asyncio
import json
from pathlib import Path

import pytest

from projects import services as project_services
from runs.models import Run
from tests.run_harness import demo_project, tiny_model
from tests.web_server import served_with_workers
from tinker_api.models import TinkerModel, TinkerWeights

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.ci_embedded_only]
__all__ = ["tiny_model"]
EPOCHS, BATCH = 3, 8


@pytest.mark.timeout(600)
def test_the_cookbooks_supervised_loop_learns_through_the_tinker_api(tiny_model, tmp_path, monkeypatch):
    import tinker_cookbook
    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    setup = demo_project(tiny_model)
    _, token = project_services.api_token_create(user=setup["owner"], name="cookbook")
    monkeypatch.setenv("TINKER_API_KEY", f"tml-{token}")
    conversations = Path(tinker_cookbook.__file__).parent / "example_data" / "conversations.jsonl"
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=str(tiny_model), renderer_name="role_colon", max_length=256, batch_size=BATCH
    )
    with served_with_workers(tmp_path / "web.log") as server:
        config = train.Config(
            log_path=str(tmp_path / "log"),
            model_name=str(tiny_model),
            recipe_name="flywheel-test",
            renderer_name="role_colon",
            dataset_builder=FromConversationFileBuilder(common_config=common, file_path=str(conversations)),
            learning_rate=1e-2,
            lr_schedule="constant",
            num_epochs=EPOCHS,
            lora_rank=8,
            base_url=f"{server.url}/tinker",
            save_every=0,
            eval_every=0,
        )
        asyncio.run(train.main(config))
    rows = [json.loads(line) for line in (tmp_path / "log" / "metrics.jsonl").read_text().splitlines()]
    losses = [row["train_mean_nll"] for row in rows if "train_mean_nll" in row]
    steps = EPOCHS * (sum(1 for _ in conversations.open()) // BATCH)
    assert len(losses) == steps
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0, losses  # it learned the conversations
    model = TinkerModel.objects.select_related("run").get()
    assert model.optim_steps == steps
    saved = {(w.kind, w.name) for w in model.weights.all()}
    assert saved == {(TinkerWeights.Kind.STATE, "final"), (TinkerWeights.Kind.SAMPLER, "final")}
    assert Run.objects.get(pk=model.run_id).policy_version == steps
