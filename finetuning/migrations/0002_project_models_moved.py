# The project and task-library models moved to the projects app, tables and all: only Django's
# record of where these foreign keys point changes.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("finetuning", "0001_initial"),
        ("projects", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="finetuningfile",
                    name="project",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="fine_tuning_files",
                        to="projects.project",
                    ),
                ),
                migrations.AlterField(
                    model_name="finetuningjob",
                    name="project",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="fine_tuning_jobs",
                        to="projects.project",
                    ),
                ),
                migrations.AlterField(
                    model_name="finetuningjob",
                    name="task_set_version",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="projects.tasksetversion",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
