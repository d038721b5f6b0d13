"""Reward rules and their versions. A version's spec is the rule as data (see rewards.engine);
a version that a run has used (`used_at` set) is never changed: every edit creates a new one."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from projects.models import Project


class RewardRule(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="reward_rules")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="reward_rule_name_per_project")
        ]

    def __str__(self) -> str:
        return self.name


class RewardRuleVersion(models.Model):
    rule = models.ForeignKey(RewardRule, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    spec = models.JSONField()
    content_hash = models.CharField(max_length=64, help_text="SHA-256 of the spec's canonical JSON")
    note = models.CharField(max_length=500, blank=True, help_text="What changed, in a line")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    used_at = models.DateTimeField(null=True, blank=True, help_text="When a run first used it")

    class Meta:
        ordering = ["-number"]
        constraints = [
            models.UniqueConstraint(fields=["rule", "number"], name="reward_rule_version_number_per_rule")
        ]

    def __str__(self) -> str:
        return f"{self.rule.name} v{self.number}"

    @property
    def is_used(self) -> bool:
        return self.used_at is not None
