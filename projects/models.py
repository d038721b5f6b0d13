"""Projects, memberships, API tokens, and the task library: task sets with immutable versions, their
items, and staged imports.

These models were born in the runs app: each keeps its table (`runs_project`, ...), so a move of
code never moved data (migrations projects/0001 and runs/0016 move only Django's record)."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from core.artifacts import artifacts_storage
from core.roles import Role, role_allows


class Project(models.Model):
    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        db_table = "runs_project"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "runs_membership"
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="one_membership_per_user")]

    def __str__(self) -> str:
        return f"{self.user} is {self.role} of {self.project}"

    def allows(self, permission: str) -> bool:
        return role_allows(self.role, permission)


class ApiToken(models.Model):
    """A bearer token. Only its SHA-256 is stored; the token itself is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="First characters, to recognise it")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # The project the OpenAI-compatible routes act in when a call names none (OpenAI-Project).
    default_project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        db_table = "runs_apitoken"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class TaskSet(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="task_sets")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        db_table = "runs_taskset"
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="task_set_name_per_project")]

    def __str__(self) -> str:
        return self.name


class PublishedVersionManager(models.Manager):
    """Published versions only: a draft (an import still writing its items) exists for nobody."""

    def get_queryset(self) -> models.QuerySet:
        return super().get_queryset().filter(published=True)


class StubCheckStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"


class TaskSetVersion(models.Model):
    """An immutable snapshot of a task set's items and their train / held-out split.

    An import writes its items under a draft (unpublished, without a number) in short
    transactions, then publishes it in one: nobody sees a half-imported version, and other
    writers never wait behind a whole import.
    """

    task_set = models.ForeignKey(TaskSet, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField(null=True, help_text="None while a draft")
    published = models.BooleanField(default=True)
    draft_owner = models.CharField(max_length=255, blank=True, help_text="The importing process (a draft)")
    content_hash = models.CharField(max_length=64)
    item_count = models.PositiveIntegerField()
    kind_counts = models.JSONField(default=dict)
    split_counts = models.JSONField(default=dict)
    split_seed = models.BigIntegerField(default=0)
    heldout_fraction = models.FloatField(default=0.2)
    source_name = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The stub check of its code items (projects/stub_checks.py), run after the version commits:
    # "" for versions without code items and those imported before the check existed.
    stub_check_status = models.CharField(max_length=8, choices=StubCheckStatus.choices, blank=True)
    stub_check_done = models.PositiveIntegerField(default=0)
    stub_check_total = models.PositiveIntegerField(default=0)
    stub_check_no_credit = models.PositiveIntegerField(default=0, help_text="Items with a test a stub passes")
    stub_check_warnings = models.JSONField(default=list, blank=True, help_text="Items a stub passes in full")

    all_objects = models.Manager()  # drafts too: for the import that writes them, and the sweep
    objects = PublishedVersionManager()  # the default (Meta), so relations see published ones only

    class Meta:
        db_table = "runs_tasksetversion"
        ordering = ["-number"]
        default_manager_name = "objects"
        base_manager_name = "all_objects"
        constraints = [models.UniqueConstraint(fields=["task_set", "number"], name="version_number_per_set")]

    def __str__(self) -> str:
        return f"{self.task_set.name} v{self.number}"


class TaskItem(models.Model):
    class Kind(models.TextChoices):
        ANSWER = "answer", "Answer"
        CODE = "code", "Code"
        AGENT = "agent", "Agent"

    class Split(models.TextChoices):
        TRAIN = "train", "Train"
        HELDOUT = "heldout", "Held-out"

    version = models.ForeignKey(TaskSetVersion, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField()
    external_id = models.CharField(max_length=200)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    split = models.CharField(max_length=8, choices=Split.choices)
    # The prompt or instructions, kept in its own column so items can be searched.
    text = models.TextField()
    data = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)
    line = models.PositiveIntegerField(null=True, blank=True, help_text="Its line in the imported file")
    # What a stub of the solution passes among its tests ({"tests": [...], "passed": [...]}, or
    # {"error": ...}); None until checked, and for items that are not stubbed. Graders read it.
    stub_check = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "runs_taskitem"
        ordering = ["position"]
        constraints = [
            models.UniqueConstraint(fields=["version", "position"], name="item_position"),
            models.UniqueConstraint(fields=["version", "external_id"], name="item_id_per_version"),
        ]
        indexes = [models.Index(fields=["version", "split", "position"])]

    def __str__(self) -> str:
        return self.external_id

    def grading_dict(self) -> dict:
        """The item as graders read it: its data with id, kind and split, and, once checked, the
        tests a stub of the solution passes (`stub_check`, read by the unit_tests grader)."""
        stored = {} if self.stub_check is None else {"stub_check": self.stub_check}
        return self.data | {"id": self.external_id, "kind": self.kind, "split": self.split} | stored

    @property
    def no_credit_tests(self) -> list[str]:
        """The tests a stub passes, which pay nothing ([] when not checked)."""
        return list((self.stub_check or {}).get("passed") or [])

    @property
    def stub_passes_every_test(self) -> bool:
        check = self.stub_check or {}
        return bool(check.get("tests")) and len(check.get("passed") or []) == len(check["tests"])


class StagedImport(models.Model):
    """An uploaded file waiting for the user to confirm its import after the preview."""

    task_set = models.ForeignKey(TaskSet, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    # In the artifact storage: the preview and the confirm may reach different web hosts.
    file = models.FileField(upload_to="uploads/staged-imports/", storage=artifacts_storage)
    original_name = models.CharField(max_length=255)
    file_format = models.CharField(max_length=8)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "runs_stagedimport"

    def __str__(self) -> str:
        return self.original_name
