# The project and task-library models moved to the projects app, tables and all: only Django's
# record of where these foreign keys point changes.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("evaluations", "0001_evaluation_suites"),
        ("projects", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="suite",
                    name="project",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="eval_suites",
                        to="projects.project",
                    ),
                ),
                migrations.AlterField(
                    model_name="suiteentry",
                    name="task_set_version",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="projects.tasksetversion",
                    ),
                ),
                migrations.AlterField(
                    model_name="suiteevaluation",
                    name="project",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="suite_evaluations",
                        to="projects.project",
                    ),
                ),
                migrations.AlterField(
                    model_name="suiteresult",
                    name="item",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="projects.taskitem"
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
