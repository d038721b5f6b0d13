# Projects, memberships, tokens and the task library moved here from the runs app. Their tables stay
# as they are (`runs_project`, ...): these operations change only Django's record of the models, and
# the content types follow them so that permissions keep pointing at the same rows.

import django.db.models.deletion
import django.db.models.manager
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

import core.artifacts

MOVED = ("project", "membership", "apitoken", "taskset", "tasksetversion", "taskitem", "stagedimport")


def content_types_follow(apps, schema_editor):
    content_types = apps.get_model("contenttypes", "ContentType")
    content_types.objects.filter(app_label="runs", model__in=MOVED).update(app_label="projects")


def content_types_return(apps, schema_editor):
    content_types = apps.get_model("contenttypes", "ContentType")
    content_types.objects.filter(app_label="projects", model__in=MOVED).update(app_label="runs")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("contenttypes", "0002_remove_content_type_name"),
        ("runs", "0015_idempotency_key_to_core"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Project",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.CharField(max_length=100, unique=True)),
                        ("description", models.TextField(blank=True)),
                        (
                            "created_at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
                        (
                            "created_by",
                            models.ForeignKey(
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_project",
                        "ordering": ["name"],
                    },
                ),
                migrations.CreateModel(
                    name="ApiToken",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.CharField(max_length=100)),
                        (
                            "prefix",
                            models.CharField(help_text="First characters, to recognise it", max_length=16),
                        ),
                        ("digest", models.CharField(max_length=64, unique=True)),
                        (
                            "created_at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
                        ("last_used_at", models.DateTimeField(blank=True, null=True)),
                        ("revoked_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="api_tokens",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "default_project",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to="projects.project",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_apitoken",
                    },
                ),
                migrations.CreateModel(
                    name="TaskSet",
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
                            "created_at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
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
                                related_name="task_sets",
                                to="projects.project",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_taskset",
                    },
                ),
                migrations.CreateModel(
                    name="StagedImport",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "file",
                            models.FileField(
                                storage=core.artifacts.artifacts_storage, upload_to="uploads/staged-imports/"
                            ),
                        ),
                        ("original_name", models.CharField(max_length=255)),
                        ("file_format", models.CharField(max_length=8)),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "task_set",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="projects.taskset",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_stagedimport",
                    },
                ),
                migrations.CreateModel(
                    name="TaskSetVersion",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("number", models.PositiveIntegerField(help_text="None while a draft", null=True)),
                        ("published", models.BooleanField(default=True)),
                        (
                            "draft_owner",
                            models.CharField(
                                blank=True, help_text="The importing process (a draft)", max_length=255
                            ),
                        ),
                        ("content_hash", models.CharField(max_length=64)),
                        ("item_count", models.PositiveIntegerField()),
                        ("kind_counts", models.JSONField(default=dict)),
                        ("split_counts", models.JSONField(default=dict)),
                        ("split_seed", models.BigIntegerField(default=0)),
                        ("heldout_fraction", models.FloatField(default=0.2)),
                        ("source_name", models.CharField(blank=True, max_length=255)),
                        (
                            "created_at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
                        (
                            "stub_check_status",
                            models.CharField(
                                blank=True,
                                choices=[("queued", "Queued"), ("running", "Running"), ("done", "Done")],
                                max_length=8,
                            ),
                        ),
                        ("stub_check_done", models.PositiveIntegerField(default=0)),
                        ("stub_check_total", models.PositiveIntegerField(default=0)),
                        (
                            "stub_check_no_credit",
                            models.PositiveIntegerField(
                                default=0, help_text="Items with a test a stub passes"
                            ),
                        ),
                        (
                            "stub_check_warnings",
                            models.JSONField(
                                blank=True, default=list, help_text="Items a stub passes in full"
                            ),
                        ),
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
                            "task_set",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="versions",
                                to="projects.taskset",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_tasksetversion",
                        "ordering": ["-number"],
                        "base_manager_name": "all_objects",
                        "default_manager_name": "objects",
                    },
                    managers=[
                        ("all_objects", django.db.models.manager.Manager()),
                        ("objects", django.db.models.manager.Manager()),
                    ],
                ),
                migrations.CreateModel(
                    name="TaskItem",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("position", models.PositiveIntegerField()),
                        ("external_id", models.CharField(max_length=200)),
                        (
                            "kind",
                            models.CharField(
                                choices=[("answer", "Answer"), ("code", "Code"), ("agent", "Agent")],
                                max_length=8,
                            ),
                        ),
                        (
                            "split",
                            models.CharField(
                                choices=[("train", "Train"), ("heldout", "Held-out")], max_length=8
                            ),
                        ),
                        ("text", models.TextField()),
                        ("data", models.JSONField()),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        (
                            "line",
                            models.PositiveIntegerField(
                                blank=True, help_text="Its line in the imported file", null=True
                            ),
                        ),
                        ("stub_check", models.JSONField(blank=True, null=True)),
                        (
                            "version",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="items",
                                to="projects.tasksetversion",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_taskitem",
                        "ordering": ["position"],
                    },
                ),
                migrations.CreateModel(
                    name="Membership",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "role",
                            models.CharField(
                                choices=[
                                    ("owner", "Owner"),
                                    ("launcher", "Launcher"),
                                    ("reviewer", "Reviewer"),
                                    ("viewer", "Viewer"),
                                ],
                                max_length=16,
                            ),
                        ),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="memberships",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "project",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="memberships",
                                to="projects.project",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_membership",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("project", "user"), name="one_membership_per_user"
                            )
                        ],
                    },
                ),
                migrations.AddConstraint(
                    model_name="taskset",
                    constraint=models.UniqueConstraint(
                        fields=("project", "name"), name="task_set_name_per_project"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="tasksetversion",
                    constraint=models.UniqueConstraint(
                        fields=("task_set", "number"), name="version_number_per_set"
                    ),
                ),
                migrations.AddIndex(
                    model_name="taskitem",
                    index=models.Index(
                        fields=["version", "split", "position"], name="runs_taskit_version_950248_idx"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="taskitem",
                    constraint=models.UniqueConstraint(fields=("version", "position"), name="item_position"),
                ),
                migrations.AddConstraint(
                    model_name="taskitem",
                    constraint=models.UniqueConstraint(
                        fields=("version", "external_id"), name="item_id_per_version"
                    ),
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_types_follow, content_types_return),
    ]
