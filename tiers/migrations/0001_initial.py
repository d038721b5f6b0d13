# Tiers and tier evaluations moved here from the runs app. Their tables stay as they are
# (`runs_tier`, `runs_tierevaluation`): these operations change only Django's record of the models,
# and the content types follow them so that permissions keep pointing at the same rows. An evaluation
# names its run by relation ("runs.Run"), so this depends on the runs app's last migration before the
# move, and runs' own record of the models is dropped after it (runs/0020_tier_and_serving_models_moved).

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

MOVED = ("tier", "tierevaluation")


def content_types_follow(apps, schema_editor):
    content_types_move(apps, "runs", "tiers")


def content_types_return(apps, schema_editor):
    content_types_move(apps, "tiers", "runs")


def content_types_move(apps, source, target):
    content_types = apps.get_model("contenttypes", "ContentType")
    moving = content_types.objects.filter(app_label=source, model__in=MOVED)
    # A partial migrate in between may have created the target's rows afresh (post_migrate): the
    # moving rows, which permissions and the admin log point at, take their place.
    content_types.objects.filter(app_label=target, model__in=moving.values("model")).delete()
    moving.update(app_label=target)


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("contenttypes", "0002_remove_content_type_name"),
        ("projects", "0001_initial"),
        ("runs", "0019_project_quota"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Tier",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.CharField(max_length=100)),
                        ("description", models.TextField(blank=True)),
                        (
                            "base_model",
                            models.CharField(help_text="A local path or a hub id", max_length=500),
                        ),
                        (
                            "device",
                            models.CharField(
                                choices=[("auto", "auto"), ("cpu", "CPU"), ("cuda", "CUDA GPU")],
                                default="auto",
                                max_length=8,
                            ),
                        ),
                        (
                            "precision",
                            models.CharField(
                                choices=[
                                    ("fp32", "fp32"),
                                    ("bf16", "bf16"),
                                    ("fp16", "fp16"),
                                    ("int8", "int8 (dynamic quantisation)"),
                                ],
                                default="fp32",
                                max_length=8,
                            ),
                        ),
                        (
                            "speculation",
                            models.CharField(
                                choices=[
                                    ("none", "none"),
                                    ("draft_model", "draft model"),
                                    ("prompt_lookup", "prompt lookup (n-gram)"),
                                ],
                                default="none",
                                max_length=16,
                            ),
                        ),
                        ("draft_model", models.CharField(blank=True, max_length=500)),
                        ("speculative_tokens", models.PositiveSmallIntegerField(default=0)),
                        ("temperature", models.FloatField(default=1.0)),
                        ("top_p", models.FloatField(default=1.0)),
                        ("top_k", models.PositiveIntegerField(default=0, help_text="0 turns top-k off")),
                        ("stop", models.JSONField(blank=True, default=list)),
                        ("max_new_tokens", models.PositiveIntegerField(default=256)),
                        ("batch_size", models.PositiveIntegerField(default=8)),
                        (
                            "chat",
                            models.BooleanField(
                                default=True,
                                help_text=(
                                    "Render prompts with the model's chat template (when it has one); "
                                    "off: raw prompts"
                                ),
                            ),
                        ),
                        (
                            "engine",
                            models.CharField(
                                choices=[
                                    ("local", "Flywheel's decoder"),
                                    ("openai", "OpenAI-compatible engine"),
                                ],
                                default="local",
                                help_text=(
                                    "Who decodes: Flywheel's own decoder, "
                                    "or an OpenAI-compatible engine (vLLM, SGLang)"
                                ),
                                max_length=8,
                            ),
                        ),
                        (
                            "engine_url",
                            models.CharField(
                                blank=True,
                                help_text=(
                                    "The engine's base URL, such as http://gpu-1:8000/v1; "
                                    "several servers: comma-separated"
                                ),
                                max_length=500,
                            ),
                        ),
                        (
                            "engine_model",
                            models.CharField(
                                blank=True,
                                help_text="The model name the engine serves (its --served-model-name)",
                                max_length=500,
                            ),
                        ),
                        (
                            "engine_api_key_env",
                            models.CharField(
                                blank=True,
                                help_text=(
                                    "The NAME of the environment variable that holds "
                                    "the engine's API key on worker hosts"
                                ),
                                max_length=100,
                            ),
                        ),
                        (
                            "engine_adapters",
                            models.CharField(
                                choices=[
                                    ("none", "none (the engine's model only)"),
                                    ("vllm", "vLLM runtime LoRA loading (also Flywheel's /v1)"),
                                    ("sglang", "SGLang runtime LoRA loading"),
                                ],
                                default="none",
                                help_text="How the engine loads a LoRA run's policy versions at run time",
                                max_length=8,
                            ),
                        ),
                        (
                            "engine_adapter_root",
                            models.CharField(
                                blank=True,
                                help_text=(
                                    "Where the engine's host mounts the artifact storage; "
                                    "empty: send artifact names"
                                ),
                                max_length=500,
                            ),
                        ),
                        (
                            "created_at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
                        ("updated_at", models.DateTimeField(auto_now=True)),
                        (
                            "created_by",
                            models.ForeignKey(
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "project",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="tiers",
                                to="projects.project",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_tier",
                    },
                ),
                migrations.CreateModel(
                    name="TierEvaluation",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "tier_configs",
                            models.JSONField(
                                help_text="Each evaluated tier's id, name and settings when requested"
                            ),
                        ),
                        (
                            "checkpoint",
                            models.CharField(
                                help_text="The policy evaluated: a local path or a hub id", max_length=500
                            ),
                        ),
                        ("policy_version", models.PositiveIntegerField(blank=True, null=True)),
                        ("split", models.CharField(default="heldout", max_length=8)),
                        (
                            "limit",
                            models.PositiveIntegerField(
                                blank=True, help_text="Evaluate the first N items only", null=True
                            ),
                        ),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("queued", "Queued"),
                                    ("running", "Running"),
                                    ("succeeded", "Succeeded"),
                                    ("failed", "Failed"),
                                ],
                                db_index=True,
                                default="queued",
                                max_length=16,
                            ),
                        ),
                        (
                            "results",
                            models.JSONField(
                                blank=True,
                                default=list,
                                help_text="One entry per tier, in tier_configs order",
                            ),
                        ),
                        ("error", models.TextField(blank=True)),
                        ("attempts", models.PositiveIntegerField(default=0)),
                        (
                            "created_at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
                        ("started_at", models.DateTimeField(blank=True, null=True)),
                        ("finished_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "created_by",
                            models.ForeignKey(
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "project",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="tier_evaluations",
                                to="projects.project",
                            ),
                        ),
                        (
                            "run",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="tier_evaluations",
                                to="runs.run",
                            ),
                        ),
                        (
                            "task_set_version",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="projects.tasksetversion",
                            ),
                        ),
                        (
                            "tier",
                            models.ForeignKey(
                                help_text="Requested from",
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="evaluations",
                                to="tiers.tier",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_tierevaluation",
                        "ordering": ["-created_at", "-id"],
                    },
                ),
                migrations.AddConstraint(
                    model_name="tier",
                    constraint=models.UniqueConstraint(
                        fields=("project", "name"), name="tier_name_per_project"
                    ),
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_types_follow, content_types_return),
    ]
