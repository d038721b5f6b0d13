"""The backtest of a reward rule version on a past run, as a page and over REST: the form, the
view and its charts, the serializers. A backtest rescores a run's trajectories, so it lives in
runs (above rewards); its URLs are the rewards ones (/reward-rules/<id>/backtest/ and
/api/v1/reward-rules/<id>/backtest)."""

from typing import Any, cast

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from core.callers import caller
from core.exceptions import StateError
from core.roles import Permission
from core.views import ApiView
from projects.selectors import page_access
from rewards import selectors as reward_selectors
from rewards.api import serializers as reward_serializers
from rewards.models import RewardRule, RewardRuleVersion
from runs import backtest
from runs.backtest import BACKTEST_DEFAULT_LIMIT, BACKTEST_MAX_LIMIT, HISTOGRAM_BINS, MAX_HISTOGRAM_BINS

# --- the page ------------------------------------------------------------------------------


class BacktestForm(forms.Form):
    run = forms.TypedChoiceField(coerce=int, label="Past run")
    version = forms.TypedChoiceField(coerce=int, label="Rule version to try")
    limit = forms.IntegerField(
        min_value=1,
        max_value=BACKTEST_MAX_LIMIT,
        required=False,
        label="At most",
        help_text=f"Trajectories to rescore, the newest first; empty: {BACKTEST_DEFAULT_LIMIT}",
    )

    def __init__(self, *args: Any, runs: list[tuple[int, str]], versions: list[int], **kwargs):
        super().__init__(*args, **kwargs)
        cast(forms.TypedChoiceField, self.fields["run"]).choices = runs
        cast(forms.TypedChoiceField, self.fields["version"]).choices = [(n, f"v{n}") for n in versions]


def _backtest_form(request: HttpRequest, rule: RewardRule, versions: list[RewardRuleVersion]) -> BacktestForm:
    runs = [
        (
            run.pk,
            f"{run.name} #{run.pk} · {run.status} · {run.scored_count} scored · "
            f"{run.reward_rule_version.rule.name} v{run.reward_rule_version.number}",
        )
        for run in backtest.backtest_runs_of(project=rule.project)
    ]
    return BacktestForm(
        request.POST if request.method == "POST" else None,
        initial={"version": versions[0].number},
        runs=runs,
        versions=[version.number for version in versions],
    )


@login_required
@require_http_methods(["GET", "POST"])
def reward_rule_backtest(request: HttpRequest, rule_id: int) -> HttpResponse:
    rule = reward_selectors.reward_rule_for(user=caller(request), rule_id=rule_id, permission=Permission.EDIT)
    versions = list(reward_selectors.versions_of(rule=rule))
    form = _backtest_form(request, rule, versions)
    result = None
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        version = reward_selectors.version_of(rule=rule, number=data["version"])
        try:
            run = backtest.backtest_run_of(rule=rule, run_id=data["run"])
            result = backtest.reward_rule_backtest(run=run, version=version, limit=data["limit"])
        except ValidationError as exc:
            for name, field_messages in exc.message_dict.items():
                for message in field_messages:
                    form.add_error(name if name in form.fields else None, message)
        except StateError as exc:
            form.add_error(None, str(exc))
    context = page_access(user=caller(request), project=rule.project) | {
        "rule": rule,
        "form": form,
        "result": result,
    }
    if result is not None:
        top = max([*result.histogram.old, *result.histogram.new, 1])
        context["charts"] = [
            {"title": f"{result.old_version.rule.name} v{result.old_version.number} (the run)", "side": "old"}
            | histogram_chart(result.histogram.edges, result.histogram.old, top),
            {"title": f"{rule.name} v{result.version.number} (backtest)", "side": "new"}
            | histogram_chart(result.histogram.edges, result.histogram.new, top),
        ]
    return render(request, "rewards/backtest.html", context)


CHART_WIDTH, CHART_HEIGHT = 360, 190
CHART_LEFT, CHART_RIGHT, CHART_TOP, CHART_BOTTOM = 34, 8, 10, 26
MAX_AXIS_LABELS = 6


def histogram_chart(edges: list[float], counts: list[int], top: int) -> dict[str, Any]:
    """An SVG bar chart's geometry, in viewBox units. Both charts of a backtest share `top` (the
    largest count of either side), so bar heights compare across them."""
    plot_width = CHART_WIDTH - CHART_LEFT - CHART_RIGHT
    plot_height = CHART_HEIGHT - CHART_TOP - CHART_BOTTOM
    baseline = CHART_TOP + plot_height
    width = plot_width / len(counts) if counts else plot_width
    bars = []
    for index, count in enumerate(counts):
        height = plot_height * count / top
        bars.append(
            {
                "x": round(CHART_LEFT + index * width + 1, 2),
                "y": round(baseline - height, 2),
                "width": round(max(width - 2, 1), 2),
                "height": round(height, 2),
                "count": count,
                "low": f"{edges[index]:.4g}",
                "high": f"{edges[index + 1]:.4g}",
            }
        )
    step = max(1, -(-(len(edges) - 1) // (MAX_AXIS_LABELS - 1)))
    shown = sorted({*range(0, len(edges), step), len(edges) - 1}) if edges else []
    return {
        "width": CHART_WIDTH,
        "height": CHART_HEIGHT,
        "left": CHART_LEFT,
        "right": CHART_WIDTH - CHART_RIGHT,
        "top": CHART_TOP,
        "baseline": baseline,
        "bars": bars,
        "x_labels": [
            {"x": round(CHART_LEFT + index * width, 2), "text": f"{edges[index]:.3g}"} for index in shown
        ],
        "y_labels": [{"y": baseline, "text": "0"}, {"y": CHART_TOP, "text": str(top)}],
        "label_y": baseline + 16,
    }


# --- REST ------------------------------------------------------------------------------------


class BacktestInputSerializer(serializers.Serializer):
    run = serializers.IntegerField(min_value=1, help_text="A past run of the rule's project")
    version = serializers.IntegerField(required=False, min_value=1, help_text="Default: the latest")
    limit = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=BACKTEST_MAX_LIMIT,
        help_text=f"Rescore at most this many scored trajectories, the newest first; "
        f"default {BACKTEST_DEFAULT_LIMIT}",
    )
    bins = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_HISTOGRAM_BINS,
        help_text=f"Histogram bins; default {HISTOGRAM_BINS}",
    )


class RuleVersionRefSerializer(serializers.Serializer):
    rule = serializers.IntegerField(source="rule_id")
    name = serializers.CharField(source="rule.name")
    version = serializers.IntegerField(source="number")


class HistogramSerializer(serializers.Serializer):
    edges = serializers.ListField(
        child=serializers.FloatField(),
        help_text="Shared bin edges: bin i is [edges[i], edges[i+1]), the last closed; empty when no rewards",
    )
    old = serializers.ListField(child=serializers.IntegerField(), help_text="Counts of the run's rewards")
    new = serializers.ListField(child=serializers.IntegerField(), help_text="Counts of the new rewards")


class ChangedTrajectorySerializer(serializers.Serializer):
    trajectory = serializers.IntegerField()
    item_id = serializers.CharField()
    old = serializers.FloatField()
    new = serializers.FloatField()
    delta = serializers.FloatField(help_text="new - old")
    old_components = serializers.DictField(child=serializers.FloatField(allow_null=True))
    new_components = serializers.DictField(child=serializers.FloatField(allow_null=True))
    # A declared field named like Serializer.errors: DRF's metaclass takes it out of the class attributes.
    errors = reward_serializers.GraderErrorSerializer(  # type: ignore[assignment]
        many=True, help_text="The new scoring's grader errors"
    )
    flags = serializers.ListField(child=serializers.CharField(), help_text="Detectors that flag it now")
    completion = serializers.CharField(allow_blank=True, help_text="The start of the completion text")


class BacktestResultSerializer(serializers.Serializer):
    run = serializers.IntegerField(source="run.pk")
    rule = serializers.IntegerField(source="version.rule_id")
    version = serializers.IntegerField(source="version.number")
    old_version = RuleVersionRefSerializer(help_text="The rule version the run scored with")
    total = serializers.IntegerField(help_text="The run's scored trajectories")
    count = serializers.IntegerField(help_text="How many were rescored")
    limit = serializers.IntegerField()
    limited = serializers.BooleanField(help_text="The run has more scored trajectories than `limit`")
    skipped_errored = serializers.IntegerField(
        help_text="Errored in the run (no reward): reported, not rescored"
    )
    skipped_cancelled = serializers.IntegerField()
    old_mean = serializers.FloatField(allow_null=True)
    new_mean = serializers.FloatField(allow_null=True)
    old_scored = serializers.IntegerField(help_text="Rescored trajectories with a stored reward")
    new_scored = serializers.IntegerField(help_text="Rescored trajectories with a new total")
    errored = serializers.IntegerField(help_text="The new scoring hit an infrastructure failure")
    ungradeable = serializers.IntegerField(help_text="The new rule cannot judge them (no total)")
    changed_count = serializers.IntegerField(help_text="Rewards known on both sides that differ")
    histogram = HistogramSerializer()
    changed = ChangedTrajectorySerializer(many=True, help_text="The largest |delta| first")
    newly_flagged = serializers.IntegerField(
        help_text="Trajectories with a hacking flag the run did not record"
    )
    new_flags = serializers.DictField(
        child=serializers.IntegerField(), help_text="Detector -> trajectories it newly flags"
    )


class RewardRuleBacktestView(ApiView):
    @extend_schema(
        request=BacktestInputSerializer,
        responses=BacktestResultSerializer,
        summary="Rescore a past run's scored trajectories with a version: both reward histograms "
        "and the trajectories that changed most; stores nothing. A run of another project answers 400",
    )
    def post(self, request: Request, id: int) -> Response:
        rule = reward_selectors.reward_rule_for(user=caller(request), rule_id=id, permission=Permission.EDIT)
        data = self.validated(BacktestInputSerializer)
        number = data.get("version")
        version = (
            reward_selectors.latest_version_of(rule=rule)
            if number is None
            else reward_selectors.version_of(rule=rule, number=number)
        )
        run = backtest.backtest_run_of(rule=rule, run_id=data["run"])
        result = backtest.reward_rule_backtest(
            run=run, version=version, limit=data.get("limit"), bins=data.get("bins", backtest.HISTOGRAM_BINS)
        )
        return Response(BacktestResultSerializer(result).data)
