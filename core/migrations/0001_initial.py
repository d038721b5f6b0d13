# The idempotency-key table moved here from the runs app: the table stays as it is
# (`runs_idempotencykey`); only Django's record of which app owns it changes.

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("runs", "0014_api_token_default_project"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="IdempotencyKey",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("key", models.CharField(max_length=255)),
                        ("request_fingerprint", models.CharField(max_length=64)),
                        ("response_status", models.PositiveSmallIntegerField(null=True)),
                        ("response_body", models.JSONField(null=True)),
                        (
                            "created_at",
                            models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                        ),
                        ("owner", models.CharField(blank=True, max_length=255)),
                        ("lease_until", models.DateTimeField(blank=True, null=True)),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "runs_idempotencykey",
                        "constraints": [
                            models.UniqueConstraint(fields=("user", "key"), name="idempotency_key_per_user")
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
