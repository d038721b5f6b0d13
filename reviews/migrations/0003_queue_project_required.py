"""Every queue names its project (a separate migration: PostgreSQL refuses to alter a table whose
rows the previous one's backfill updated in the same transaction)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("reviews", "0002_reviews_of_traces")]

    operations = [
        migrations.AlterField(
            model_name="reviewqueue",
            name="project",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, related_name="review_queues", to="runs.project"
            ),
        ),
    ]
