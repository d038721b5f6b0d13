# Tiers moved to the tiers app, table and all: only Django's record of where this foreign key
# points changes.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("evaluations", "0002_project_models_moved"),
        ("tiers", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="suiteevaluation",
                    name="tier",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="tiers.tier",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
