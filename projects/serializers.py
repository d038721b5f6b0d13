"""Input serializers check types and shapes; services check the rules. Output serializers are what
a client sees: every object has `id`, `created_at` (ISO 8601 UTC) and the ids of related objects."""

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.roles import ROLE_PERMISSIONS, Permission, Role
from projects.models import ApiToken, Membership, Project, TaskItem, TaskSet, TaskSetVersion
from projects.stub_checks import STUB_NOTE, stub_check_summary
from projects.task_format import IMPORT_FORMATS

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1

# --- query parameters ----------------------------------------------------------------------


class ProjectFilterSerializer(serializers.Serializer):
    project = serializers.IntegerField(required=False, min_value=1, help_text="Only this project's")


class TaskFilterSerializer(serializers.Serializer):
    version = serializers.IntegerField(
        required=False, min_value=1, help_text="A version id: its items in file order"
    )
    split = serializers.ChoiceField(choices=TaskItem.Split.choices, required=False)
    kind = serializers.ChoiceField(choices=TaskItem.Kind.choices, required=False)
    q = serializers.CharField(required=False, help_text="Search the prompt or instructions, and the id")


# --- the caller ----------------------------------------------------------------------------


class RoleSerializer(serializers.Serializer):
    project = serializers.IntegerField(source="project_id")
    project_name = serializers.CharField(source="project.name")
    role = serializers.ChoiceField(choices=Role.choices)
    permissions = serializers.SerializerMethodField()

    @extend_schema_field(serializers.ListField(child=serializers.ChoiceField(choices=Permission.choices)))
    def get_permissions(self, membership: Membership) -> list[str]:
        return sorted(str(p) for p in ROLE_PERMISSIONS[membership.role])


class MeSerializer(serializers.Serializer):
    id = serializers.IntegerField(source="user.id")
    username = serializers.CharField(source="user.username")
    email = serializers.CharField(source="user.email")
    created_at = serializers.DateTimeField(source="user.date_joined")
    roles = RoleSerializer(many=True)


# --- projects and members ------------------------------------------------------------------


class ProjectSerializer(serializers.ModelSerializer):
    class Meta:
        model = Project
        fields = ["id", "name", "description", "created_by", "created_at"]
        read_only_fields = fields


class ProjectInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True)


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "project", "user", "username", "role", "created_at"]
        read_only_fields = fields


class MemberCreateSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)


class MemberUpdateSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


# --- task sets, versions, items ------------------------------------------------------------


class TaskSetSerializer(serializers.ModelSerializer):
    class Meta:
        model = TaskSet
        fields = ["id", "project", "name", "description", "created_by", "created_at"]
        read_only_fields = fields


class TaskSetCreateSerializer(serializers.Serializer):
    project = serializers.IntegerField(min_value=1)
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True)


class TaskSetUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(allow_blank=True)


STUB_CHECK_STATUSES = ["none", "queued", "running", "done"]


class StubWarningSerializer(serializers.Serializer):
    item = serializers.CharField(help_text="The item's id")
    line = serializers.IntegerField(allow_null=True, help_text="Its line in the imported file")
    message = serializers.CharField()


class StubCheckSerializer(serializers.Serializer):
    status = serializers.ChoiceField(
        choices=STUB_CHECK_STATUSES,
        help_text="none: no code items (or imported before the check existed); queued, running, done",
    )
    done = serializers.IntegerField(help_text="Code items checked so far")
    total = serializers.IntegerField(help_text="Code items to check")
    items_with_no_credit_tests = serializers.IntegerField(help_text="Items with a test a stub passes")
    warnings = StubWarningSerializer(
        many=True, help_text="Items whose every test a stub passes: they can only ever pay 0"
    )
    note = serializers.CharField(help_text="How results show a test a stub passes")


class VersionSerializer(serializers.ModelSerializer):
    kind_counts = serializers.DictField(child=serializers.IntegerField(), read_only=True)
    split_counts = serializers.DictField(child=serializers.IntegerField(), read_only=True)
    stub_check = serializers.SerializerMethodField(
        help_text="Each code item's tests run against a stub of the solution after the import: "
        "tests a stub passes carry no credit"
    )

    class Meta:
        model = TaskSetVersion
        fields = [
            "id",
            "task_set",
            "number",
            "content_hash",
            "item_count",
            "kind_counts",
            "split_counts",
            "split_seed",
            "heldout_fraction",
            "source_name",
            "created_by",
            "created_at",
            "stub_check",
        ]
        read_only_fields = fields

    @extend_schema_field(StubCheckSerializer)
    def get_stub_check(self, version: TaskSetVersion) -> dict:
        return stub_check_summary(version=version)


class ReferenceCheckSerializer(serializers.Serializer):
    item = serializers.CharField(help_text="The item's id")
    position = serializers.IntegerField(help_text="Its place in the version, from 0")
    passed = serializers.BooleanField()
    reason = serializers.CharField(allow_blank=True, help_text="Why the reference fails its tests")
    tests = serializers.ListField(child=serializers.DictField(), help_text="Each test's outcome")
    no_credit = serializers.ListField(
        child=serializers.CharField(),
        help_text="The tests a stub of the solution passes (no credit: a stub passes this test)",
    )


class ReferenceReportSerializer(serializers.Serializer):
    checked = serializers.IntegerField(help_text="Code items with a reference_solution, run")
    passed = serializers.IntegerField()
    skipped = serializers.IntegerField(help_text="Items with no reference_solution, or not code")
    errored = serializers.IntegerField(help_text="The sandbox failed: not the item's fault")
    broken = ReferenceCheckSerializer(many=True, help_text="Every item whose reference fails, by name")
    # Declared fields named like Serializer.errors and .data: DRF's metaclass takes them out of the
    # class attributes.
    errors = ReferenceCheckSerializer(many=True)  # type: ignore[assignment]
    stub_passes_every_test = serializers.ListField(
        child=serializers.CharField(),
        help_text="Items whose every test a stub of the solution passes: they can only ever pay 0",
    )


class ImportResultSerializer(VersionSerializer):
    created = serializers.SerializerMethodField(
        help_text="false: the content equals the latest version, which is returned"
    )
    references = serializers.SerializerMethodField(
        help_text="With `verify_references`: each code item's reference run against its tests"
    )

    class Meta(VersionSerializer.Meta):
        fields = [*VersionSerializer.Meta.fields, "created", "references"]
        read_only_fields = fields

    def get_created(self, version: TaskSetVersion) -> bool:
        return self.context["created"]

    @extend_schema_field(ReferenceReportSerializer(allow_null=True))
    def get_references(self, version: TaskSetVersion) -> dict | None:
        return self.context.get("references")


class TaskSetCreatedSerializer(TaskSetSerializer):
    version = serializers.SerializerMethodField(help_text="Its first version, when created with a file")

    class Meta(TaskSetSerializer.Meta):
        fields = [*TaskSetSerializer.Meta.fields, "version"]
        read_only_fields = fields

    @extend_schema_field(VersionSerializer(allow_null=True))
    def get_version(self, task_set: TaskSet) -> dict | None:
        version = self.context.get("version")
        return None if version is None else VersionSerializer(version).data


class SplitSettingsSerializer(serializers.Serializer):
    split_seed = serializers.IntegerField(min_value=INT64_MIN, max_value=INT64_MAX)
    heldout_fraction = serializers.FloatField(min_value=0, max_value=1)


class ImportInputSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="JSONL (any kind of item) or CSV (answer items)")
    format = serializers.ChoiceField(
        choices=list(IMPORT_FORMATS),
        required=False,
        help_text="auto (default): CSV or JSONL from the file name, each JSONL line in Flywheel's "
        "format or a published one (HumanEval, MBPP, APPS, CodeContests, LiveCodeBench) recognised "
        "by its fields; jsonl, csv: that syntax; flywheel: Flywheel's lines only; humaneval, mbpp, "
        "apps, codecontests, livecodebench: every line in that format",
    )
    split_seed = serializers.IntegerField(
        min_value=INT64_MIN, max_value=INT64_MAX, required=False, help_text="Default: the latest version's"
    )
    heldout_fraction = serializers.FloatField(
        min_value=0, max_value=1, required=False, help_text="Default: the latest version's, else 0.2"
    )
    dry_run = serializers.BooleanField(default=False, help_text="Validate and preview; store nothing")
    verify_references = serializers.BooleanField(
        default=False,
        help_text="After importing, run each code item's reference_solution against its tests and report",
    )


class TaskSetCreateImportSerializer(TaskSetCreateSerializer):
    """A new task set with a file as its first version: both, or, on any error, neither."""

    file = serializers.FileField(help_text="JSONL (any kind of item) or CSV (answer items)")
    format = serializers.ChoiceField(
        choices=list(IMPORT_FORMATS), required=False, help_text="How the lines are read, as for an import"
    )
    split_seed = serializers.IntegerField(
        min_value=INT64_MIN, max_value=INT64_MAX, required=False, help_text="Default: 0"
    )
    heldout_fraction = serializers.FloatField(
        min_value=0, max_value=1, required=False, help_text="Default: 0.2"
    )
    dry_run = serializers.BooleanField(default=False, help_text="Validate and preview; create nothing")


class LineErrorSerializer(serializers.Serializer):
    line = serializers.IntegerField()
    param = serializers.CharField(source="field", allow_null=True)
    message = serializers.CharField()


class PreviewItemSerializer(serializers.Serializer):
    line = serializers.IntegerField()
    id = serializers.CharField(source="external_id")
    kind = serializers.ChoiceField(choices=TaskItem.Kind.choices)
    split = serializers.ChoiceField(choices=TaskItem.Split.choices)
    text = serializers.CharField()
    data = serializers.DictField()  # type: ignore[assignment]  # a declared field (see ReferenceReportSerializer)


class DryRunSerializer(serializers.Serializer):
    item_count = serializers.IntegerField()
    kind_counts = serializers.DictField(child=serializers.IntegerField())
    split_counts = serializers.DictField(child=serializers.IntegerField())
    errors = LineErrorSerializer(many=True, help_text="The first errors, each with its line")  # type: ignore[assignment]
    error_count = serializers.IntegerField()
    preview = PreviewItemSerializer(many=True)


class ItemStubCheckSerializer(serializers.Serializer):
    tests = serializers.ListField(child=serializers.CharField(), help_text="Every test's name")
    no_credit = serializers.ListField(
        child=serializers.CharField(), help_text="The tests a stub of the solution passes: they pay nothing"
    )
    stub_passes_every_test = serializers.BooleanField(help_text="true: the item can only ever pay 0")
    note = serializers.CharField()


class TaskItemSerializer(serializers.ModelSerializer):
    data = serializers.DictField(read_only=True)  # type: ignore[assignment]  # a declared field
    stub_check = serializers.SerializerMethodField(
        help_text="A code item's tests run against a stub of the solution; null until checked"
    )

    class Meta:
        model = TaskItem
        fields = [
            "id",
            "version",
            "position",
            "line",
            "external_id",
            "kind",
            "split",
            "text",
            "data",
            "stub_check",
            "created_at",
        ]
        read_only_fields = fields

    @extend_schema_field(ItemStubCheckSerializer(allow_null=True))
    def get_stub_check(self, item: TaskItem) -> dict | None:
        check = item.stub_check
        if not check or "tests" not in check:
            return None
        return {
            "tests": check["tests"],
            "no_credit": item.no_credit_tests,
            "stub_passes_every_test": item.stub_passes_every_test,
            "note": STUB_NOTE,
        }


# --- tokens --------------------------------------------------------------------------------


class ApiTokenSerializer(serializers.ModelSerializer):
    is_active = serializers.BooleanField(read_only=True)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "is_active",
            "default_project",
            "created_at",
            "last_used_at",
            "revoked_at",
        ]
        read_only_fields = fields


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.SerializerMethodField(
        help_text="The secret, shown this once; null when an Idempotency-Key replays the response"
    )

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_token(self, token: ApiToken) -> Any:
        return self.context["raw_token"]


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    default_project = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=2**63 - 1,
        help_text="The project OpenAI-compatible calls act in when they send no OpenAI-Project header",
    )
