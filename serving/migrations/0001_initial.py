# Served adapters moved here from the runs app. Their table stays as it is (`runs_servedadapter`):
# these operations change only Django's record of the model, and its content type follows it so
# that permissions keep pointing at the same rows.

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

MOVED = ("servedadapter",)


def content_types_follow(apps, schema_editor):
    content_types_move(apps, "runs", "serving")


def content_types_return(apps, schema_editor):
    content_types_move(apps, "serving", "runs")


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
        ("runs", "0019_project_quota"),
        ("tiers", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ServedAdapter",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        (
                            "name",
                            models.CharField(
                                help_text="The model id requests name", max_length=200, unique=True
                            ),
                        ),
                        (
                            "artifact",
                            models.CharField(
                                help_text="The policy version's name in the artifact storage", max_length=500
                            ),
                        ),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        (
                            "loaded_by",
                            models.ForeignKey(
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "run",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="served_adapters",
                                to="runs.run",
                            ),
                        ),
                        (
                            "tier",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="served_adapters",
                                to="tiers.tier",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_servedadapter",
                        "ordering": ["name"],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_types_follow, content_types_return),
    ]
