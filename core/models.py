"""The API core's one table: idempotency keys of creating POSTs."""

from django.conf import settings
from django.db import models
from django.utils import timezone


class IdempotencyKey(models.Model):
    """A creating POST's key and its first response, replayed when the same request repeats."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    request_fingerprint = models.CharField(max_length=64)
    response_status = models.PositiveSmallIntegerField(null=True)
    response_body = models.JSONField(null=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    # While in flight: the process serving the request (host:pid:start) and its lease, renewed while
    # it runs. A request that died with its server is released at once on its host, else at the lease.
    owner = models.CharField(max_length=255, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        # Moved from the runs app, table and all: the table keeps its name.
        db_table = "runs_idempotencykey"
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="idempotency_key_per_user")]

    def __str__(self) -> str:
        return self.key

    @property
    def in_flight(self) -> bool:
        return self.response_status is None
