# The idempotency-key table now belongs to the core app (core/0001_initial); its rows stay put.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0014_api_token_default_project"),
        ("core", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="IdempotencyKey")],
            database_operations=[],
        ),
    ]
