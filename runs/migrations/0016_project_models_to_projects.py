# The project and task-library models now belong to the projects app (projects/0001_initial); this
# removes them from the runs app's record once every app points at the new home. No table changes.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('projects', '0001_initial'),
        ('runs', '0015_idempotency_key_to_core'),
        ('reviews', '0005_project_models_moved'),
        ('reward_models', '0003_project_models_moved'),
        ('rewards', '0002_project_models_moved'),
        ('traces', '0002_project_models_moved'),
        ('webhooks', '0005_project_models_moved'),
        ('evaluations', '0002_project_models_moved'),
        ('finetuning', '0002_project_models_moved'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name='membership',
                    name='project',
                ),
                migrations.RemoveField(
                    model_name='membership',
                    name='user',
                ),
                migrations.RemoveField(
                    model_name='project',
                    name='created_by',
                ),
                migrations.AlterField(
                    model_name='run',
                    name='project',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='runs', to='projects.project'),
                ),
                migrations.AlterField(
                    model_name='tierevaluation',
                    name='project',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='tier_evaluations', to='projects.project'),
                ),
                migrations.AlterField(
                    model_name='tier',
                    name='project',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='tiers', to='projects.project'),
                ),
                migrations.RemoveField(
                    model_name='taskset',
                    name='project',
                ),
                migrations.RemoveField(
                    model_name='stagedimport',
                    name='task_set',
                ),
                migrations.RemoveField(
                    model_name='stagedimport',
                    name='user',
                ),
                migrations.RemoveField(
                    model_name='taskitem',
                    name='version',
                ),
                migrations.AlterField(
                    model_name='trajectory',
                    name='item',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='projects.taskitem'),
                ),
                migrations.AlterField(
                    model_name='heldoutresult',
                    name='item',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='projects.taskitem'),
                ),
                migrations.RemoveField(
                    model_name='taskset',
                    name='created_by',
                ),
                migrations.RemoveField(
                    model_name='tasksetversion',
                    name='task_set',
                ),
                migrations.RemoveField(
                    model_name='tasksetversion',
                    name='created_by',
                ),
                migrations.AlterField(
                    model_name='tierevaluation',
                    name='task_set_version',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='projects.tasksetversion'),
                ),
                migrations.AlterField(
                    model_name='run',
                    name='task_set_version',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='runs', to='projects.tasksetversion'),
                ),
                migrations.DeleteModel(
                    name='ApiToken',
                ),
                migrations.DeleteModel(
                    name='Membership',
                ),
                migrations.DeleteModel(
                    name='Project',
                ),
                migrations.DeleteModel(
                    name='StagedImport',
                ),
                migrations.DeleteModel(
                    name='TaskItem',
                ),
                migrations.DeleteModel(
                    name='TaskSet',
                ),
                migrations.DeleteModel(
                    name='TaskSetVersion',
                ),
            ],
            database_operations=[],
        ),
    ]
