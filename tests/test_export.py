"""Exporting a checkpoint: the archive the REST endpoint streams and the folder `manage.py
export_checkpoint` writes are `save_pretrained` folders with a model card, which load with
`AutoModelForCausalLM.from_pretrained` and generate the same greedy text as the run's tier."""

import io
import json
import os
import random
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch
from django.core.management import CommandError, call_command
from transformers import AutoModelForCausalLM, AutoTokenizer

from core.artifacts import artifact_delete
from core.roles import Role
from flywheel import Client, NotFoundError
from inference.decoding import decode, tier_prepare
from inference.export import adapter_base, archive_chunks, is_adapter
from inference.policy import policy_load
from inference.settings import TierSettings
from projects import services as project_services
from projects.services import member_add
from runs.models import Checkpoint, MetricPoint
from runs.run_store import policy_dir, policy_prefix, policy_publish
from tests.conftest import api_client_for, make_user
from tests.run_harness import tiny_model, worker_env  # noqa: F401  (a fixture)
from tests.serving_fixtures import STEP, trained  # noqa: F401  (a fixture)
from tests.web_server import WebServer

PROMPTS = ["add 3 to x", "x plus 3"]
ROOT = Path(__file__).resolve().parent.parent


def export_url(run_id: int, step: int = STEP, **query: str) -> str:
    params = "&".join(f"{name}={value}" for name, value in query.items())
    return f"/api/v1/runs/{run_id}/checkpoints/{step}/export" + (f"?{params}" if params else "")


def body_of(response) -> bytes:
    return b"".join(response.streaming_content)


def unpack(data: bytes, archive: str, into: Path) -> Path:
    if archive == "zip":
        with zipfile.ZipFile(io.BytesIO(data)) as opened:
            opened.extractall(into)
    else:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as opened:
            opened.extractall(into, filter="data")
    (folder,) = into.iterdir()
    return folder


def tier_texts(trained, source: Path) -> list[tuple[list[int], str]]:  # noqa: F811
    """What the run's tier generates greedily from the checkpoint's own files: tokens and text."""
    settings = TierSettings.from_config(trained["run"].tier_config).with_(temperature=0.0)
    tier = tier_prepare(policy_load(source), settings)
    completions = decode(tier, [tier.prompt_text(p) for p in PROMPTS], settings)
    return [(c.token_ids, c.text) for c in completions]


def hf_texts(folder: Path, max_new_tokens: int, model=None) -> list[tuple[list[int], str]]:
    """Greedy text from the export, loaded the way anyone would load it: transformers alone (or
    the model given, for an adapter on its base)."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = model if model is not None else AutoModelForCausalLM.from_pretrained(folder)
    texts = []
    for prompt in PROMPTS:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        encoded = tokenizer(rendered, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(
                **encoded, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        new = out[0, encoded["input_ids"].shape[1] :].tolist()
        texts.append((new, tokenizer.decode(new, skip_special_tokens=True)))
    return texts


@pytest.mark.parametrize("archive", ["tar.gz", "zip"])
def test_an_exported_checkpoint_loads_with_transformers_and_generates_the_tiers_greedy_text(
    trained,  # noqa: F811
    archive,
    tmp_path,
):
    run = trained["run"]
    response = api_client_for(trained["owner"]).get(export_url(run.pk, archive=archive))
    assert response.status_code == 200
    assert response["Content-Type"] == {"zip": "application/zip", "tar.gz": "application/gzip"}[archive]
    name = f"adder-grpo-{run.pk}-step-{STEP}"
    assert response["Content-Disposition"] == f'attachment; filename="{name}.{archive}"'
    folder = unpack(body_of(response), archive, tmp_path)
    assert folder.name == name
    files = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= files
    expected = tier_texts(trained, policy_dir(run.pk, STEP))
    assert hf_texts(folder, run.tier_config["max_new_tokens"]) == expected
    # The checkpoint differs from its base: the export is the trained weights, not the base's.
    assert tier_texts(trained, trained["model"]) != expected


def test_the_model_card_names_the_base_method_data_reward_rule_and_held_out_results(trained, tmp_path):  # noqa: F811
    run = trained["run"]
    folder = unpack(body_of(api_client_for(trained["owner"]).get(export_url(run.pk))), "tar.gz", tmp_path)
    card = (folder / "README.md").read_text()
    assert card.startswith(f"---\nlibrary_name: transformers\nbase_model: {trained['model']}\n")
    assert f"# Adder GRPO, step {STEP}" in card
    assert "- Method: GRPO" in card
    assert "- Weights: full" in card
    assert "- Task set: demo v1 (12 items)" in card
    assert "- Train split: train (8 items)" in card
    assert "- Held-out split: heldout (4 items)" in card
    assert "- Name: tests v1" in card
    assert '"type": "unit_tests"' in card
    assert "| step | pass_rate | reward |" in card
    assert "| 0 | 0.25 |  |" in card
    assert f"| {STEP} (this checkpoint) | 0.75 | 0.5 |" in card


def test_export_checks_the_callers_role_and_the_checkpoint(trained):  # noqa: F811
    run = trained["run"]
    viewer = make_user("export-viewer")
    member_add(project=trained["project"], username=viewer.username, role=Role.VIEWER)
    assert api_client_for(viewer).get(export_url(run.pk)).status_code == 200
    outsider = api_client_for(make_user("export-outsider")).get(export_url(run.pk))
    assert outsider.status_code == 404
    assert outsider.json()["error"]["code"] == "not_found"
    owner = api_client_for(trained["owner"])
    missing = owner.get(export_url(run.pk, step=STEP + 1))
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == f"run {run.pk} has no checkpoint at step {STEP + 1}"
    bad = owner.get(export_url(run.pk, archive="rar"))
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "archive"
    no_adapter = owner.get(export_url(run.pk, weights="adapter"))
    assert no_adapter.status_code == 409
    assert "has no adapter" in no_adapter.json()["error"]["message"]


def test_manage_py_export_checkpoint_writes_the_folder_or_an_archive(trained, tmp_path):  # noqa: F811
    run = trained["run"]
    out = tmp_path / "export"
    call_command("export_checkpoint", run.pk, STEP, "--out", str(out), "--no-progress")
    assert hf_texts(out, run.tier_config["max_new_tokens"]) == tier_texts(trained, policy_dir(run.pk, STEP))
    assert "- Weights: full" in (out / "README.md").read_text()
    archive = tmp_path / "export.zip"
    call_command("export_checkpoint", run.pk, STEP, out=str(archive), archive="zip", no_progress=True)
    with zipfile.ZipFile(archive) as opened:
        assert f"adder-grpo-{run.pk}-step-{STEP}/model.safetensors" in opened.namelist()
    with pytest.raises(CommandError, match="already exists"):
        call_command("export_checkpoint", run.pk, STEP, "--out", str(out), "--no-progress")
    with pytest.raises(CommandError, match=f"run {run.pk} has no checkpoint at step 9"):
        call_command("export_checkpoint", run.pk, 9, "--out", str(tmp_path / "x"), "--no-progress")


def test_an_archive_is_streamed_in_chunks_of_at_most_a_megabyte_of_input(tmp_path):
    big = tmp_path / "weights.bin"
    big.write_bytes(random.Random(0).randbytes(4 << 20))  # 4 MiB that do not compress
    chunks = list(archive_chunks([("weights.bin", big), ("README.md", b"card")], "m", "tar.gz"))
    assert len(chunks) > 4
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:gz") as opened:
        assert opened.extractfile("m/weights.bin").read() == big.read_bytes()
        assert opened.extractfile("m/README.md").read() == b"card"


def test_a_lora_checkpoint_exports_its_adapter_or_merged_full_weights(trained, tmp_path):  # noqa: F811
    peft = pytest.importorskip("peft")
    run = trained["run"]
    base = AutoModelForCausalLM.from_pretrained(trained["model"])
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapted = peft.get_peft_model(base, config)
    artifact_delete(policy_prefix(run.pk, STEP))  # the version published again, as an adapter
    folder = policy_publish(run.pk, STEP, adapted, AutoTokenizer.from_pretrained(trained["model"]))
    assert is_adapter(folder) and adapter_base(folder) == str(trained["model"])
    owner = api_client_for(trained["owner"])
    adapter = unpack(body_of(owner.get(export_url(run.pk, weights="adapter"))), "tar.gz", tmp_path / "a")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter.iterdir()}
    assert "- Weights: LoRA adapter" in (adapter / "README.md").read_text()
    on_base = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(trained["model"]), adapter)
    max_new_tokens = run.tier_config["max_new_tokens"]
    assert hf_texts(adapter, max_new_tokens, on_base.eval()) == tier_texts(trained, folder)
    merged = unpack(body_of(owner.get(export_url(run.pk))), "tar.gz", tmp_path / "m")
    assert not is_adapter(merged)
    assert "- Weights: LoRA merged into the base" in (merged / "README.md").read_text()
    assert hf_texts(merged, run.tier_config["max_new_tokens"]) == tier_texts(trained, folder)


@pytest.fixture
def export_server(transactional_db, tiny_model, tmp_path):  # noqa: F811
    """The trained run, an owner's token, and the stack's web server on the test database."""
    from tests.serving_fixtures import trained_setup

    setup = trained_setup(tiny_model)
    _, token = project_services.api_token_create(user=setup["owner"], name="export")
    with WebServer(worker_env(), tmp_path / "web.log") as server:
        yield setup | {"url": server.url, "token": token}


def test_the_client_and_the_command_line_download_an_export(export_server, tmp_path):
    run, url, token = export_server["run"], export_server["url"], export_server["token"]
    with Client(url=url, token=token) as client:
        seen: list[int] = []
        path = client.checkpoints.export(
            run.pk, STEP, tmp_path / "c.zip", archive="zip", progress=seen.append
        )
        assert sum(seen) == path.stat().st_size
        with pytest.raises(NotFoundError):
            client.checkpoints.export(run.pk, STEP + 1, tmp_path / "missing.tar.gz")
    assert not (tmp_path / "missing.tar.gz").exists()  # no half-written archive left behind
    folder = unpack(path.read_bytes(), "zip", tmp_path / "client")
    assert "- Weights: full" in (folder / "README.md").read_text()
    env = os.environ | {
        "FLYWHEEL_URL": url,
        "FLYWHEEL_TOKEN": token,
        "PYTHONPATH": str(ROOT / "client" / "src"),  # the tree's client, as the editable install
    }
    out = tmp_path / "cli.tar.gz"
    argv = [sys.executable, "-m", "flywheel.cli", "--json", "checkpoints", "export", str(run.pk), str(STEP)]
    done = subprocess.run([*argv, "-o", str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"output": str(out), "bytes": out.stat().st_size}
    cli_folder = unpack(out.read_bytes(), "tar.gz", tmp_path / "cli")
    assert (cli_folder / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()

    # Without a step: the best checkpoint (held-out 0.75 at STEP), not a newer, worse one.
    Checkpoint.objects.create(run=run, step=STEP + 2, policy_version=STEP + 2, path="never-written")
    MetricPoint.objects.create(run=run, name="heldout/pass_rate", step=STEP + 2, value=0.5)
    best = tmp_path / "best.tar.gz"
    done = subprocess.run(argv[:-1] + ["-o", str(best)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    best_folder = unpack(best.read_bytes(), "tar.gz", tmp_path / "best")
    assert (best_folder / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
