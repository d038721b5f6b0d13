"""Webhook secrets encrypted at rest (core/encryption.py): the columns widen for the tokens, and
every secret stored in plain text is encrypted; backwards, they are decrypted again."""

from django.db import migrations

import core.encryption


def encrypt_secrets(apps, schema_editor) -> None:
    # The historical field is the encrypting one: it reads a plain value as is and saves it encrypted.
    Webhook = apps.get_model("webhooks", "Webhook")  # noqa: N806 (a model class)
    for webhook in Webhook.objects.all().iterator():
        webhook.save(update_fields=["secret", "previous_secret"])


def decrypt_secrets(apps, schema_editor) -> None:
    # Written in SQL: the field would encrypt them again.
    Webhook = apps.get_model("webhooks", "Webhook")  # noqa: N806
    table = schema_editor.quote_name(Webhook._meta.db_table)
    with schema_editor.connection.cursor() as cursor:
        for webhook in Webhook.objects.all().iterator():
            cursor.execute(
                f"UPDATE {table} SET secret = %s, previous_secret = %s WHERE id = %s",
                [webhook.secret, webhook.previous_secret, webhook.pk],
            )


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0002_secret_rotation"),
    ]

    operations = [
        migrations.AlterField(
            model_name="webhook",
            name="secret",
            field=core.encryption.EncryptedCharField(editable=False, max_length=500),
        ),
        migrations.AlterField(
            model_name="webhook",
            name="previous_secret",
            field=core.encryption.EncryptedCharField(blank=True, editable=False, max_length=500),
        ),
        migrations.RunPython(encrypt_secrets, decrypt_secrets),
    ]
