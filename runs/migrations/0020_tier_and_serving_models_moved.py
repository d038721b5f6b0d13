# Tiers and tier evaluations now belong to the tiers app (tiers/0001_initial), served adapters to the
# serving app (serving/0001_initial); this removes them from the runs app's record once every app
# points at the new homes. No table changes.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0019_project_quota'),
        ('tiers', '0001_initial'),
        ('serving', '0001_initial'),
        ('evaluations', '0003_tier_moved'),
        ('tinker_api', '0003_tier_moved'),
        ('traces', '0003_tier_moved'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='run',
                    name='tier',
                    field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='runs', to='tiers.tier'),
                ),
                migrations.DeleteModel(
                    name='ServedAdapter',
                ),
                migrations.DeleteModel(
                    name='TierEvaluation',
                ),
                migrations.DeleteModel(
                    name='Tier',
                ),
            ],
            database_operations=[],
        ),
    ]
