from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0003_run_key_rollout_batch_step"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="monitors",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="Alert thresholds by name; a missing one takes its default",
            ),
        ),
    ]
