"""Secrets the application must read back (a webhook's HMAC key) are encrypted at rest.

`EncryptedCharField` stores Fernet tokens (AES-128-CBC with HMAC-SHA256) under a key derived
from Django's SECRET_KEY by HKDF, prefixed `enc:v1:`; a copy of the database alone reveals no
secret. Rotating SECRET_KEY keeps stored secrets readable while the old key is listed in
SECRET_KEY_FALLBACKS; they are encrypted under the new key the next time they are saved. A value
without the prefix is a secret stored before encryption (the migrations encrypt those).
"""

import base64
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.db import models

PREFIX = "enc:v1:"
PURPOSE = b"flywheel: secrets at rest"


def fernet_for(secret_key: str) -> Fernet:
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=PURPOSE).derive(secret_key.encode())
    return Fernet(base64.urlsafe_b64encode(derived))


@lru_cache(maxsize=8)
def keyring(secret_key: str, fallbacks: tuple[str, ...]) -> MultiFernet:
    """Encrypts with the current key; decrypts with it or any fallback."""
    return MultiFernet([fernet_for(key) for key in (secret_key, *fallbacks)])


def current_keyring() -> MultiFernet:
    return keyring(settings.SECRET_KEY, tuple(getattr(settings, "SECRET_KEY_FALLBACKS", ())))


def encrypt(plaintext: str) -> str:
    return PREFIX + current_keyring().encrypt(plaintext.encode()).decode()


def decrypt(stored: str) -> str:
    """The secret; a value stored before encryption is returned as it is."""
    if not stored.startswith(PREFIX):
        return stored
    try:
        return current_keyring().decrypt(stored[len(PREFIX) :].encode()).decode()
    except InvalidToken:
        raise ValueError(
            "a stored secret does not decrypt: SECRET_KEY changed without the old key in SECRET_KEY_FALLBACKS"
        ) from None


class EncryptedCharField(models.CharField):
    """A CharField whose value is encrypted in the database and plain in Python."""

    def from_db_value(self, value, expression, connection):
        return value if value in (None, "") else decrypt(value)

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        return value if value in (None, "") or value.startswith(PREFIX) else encrypt(value)
