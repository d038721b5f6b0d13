# The project and task-library models moved to the projects app, tables and all: only Django's
# record of where these foreign keys point changes.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("projects", "0001_initial"),
        ("reward_models", "0002_checkpoints"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="rewardmodel",
                    name="project",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="reward_models",
                        to="projects.project",
                    ),
                ),
                migrations.AlterField(
                    model_name="rewardmodelversion",
                    name="task_set_version",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="reward_models",
                        to="projects.tasksetversion",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
