from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0008_run_monitor_actions"),
    ]

    operations = [
        migrations.AddField(
            model_name="tier",
            name="chat",
            field=models.BooleanField(
                default=True,
                help_text="Render prompts with the model's chat template (when it has one); off: raw prompts",
            ),
        ),
    ]
