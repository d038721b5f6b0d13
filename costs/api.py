"""Costs over REST: a run's cost and budget, a project's costs over a period and its monthly
budget, and the price list. Members read (VIEW); owners change budgets (MANAGE); prices are the
operator's, set by staff users and read by every signed-in user."""

from django.core.exceptions import PermissionDenied, ValidationError
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from core.callers import caller
from core.roles import Permission
from core.views import ApiView
from costs import estimates, selectors, services
from costs import serializers as s
from projects import selectors as project_selectors
from runs import selectors as run_selectors
from runs.api.runs import references
from runs.lifecycle import RunRequest, run_problems


class RunCostView(ApiView):
    @extend_schema(
        responses=s.RunCostSerializer,
        summary="The run's units and money: in all, by kind (learner, rollout, storage) and per step",
    )
    def get(self, request: Request, id: int) -> Response:
        run = run_selectors.run_for(user=caller(request), run_id=id)
        return Response(s.RunCostSerializer(selectors.run_cost(run=run)).data)


class RunEstimateView(ApiView):
    @extend_schema(
        request=s.RunEstimateInputSerializer,
        responses=s.RunEstimateSerializer,
        summary="What a run would use before it is launched (device-hours, sandbox CPU, wall time, money, "
        "each with its range), scaled from earlier runs of its tier and method; nothing is created, "
        "unless `calibrate` launches a short calibration run whose steps become the basis",
    )
    def post(self, request: Request) -> Response:
        data = self.validated(s.RunEstimateInputSerializer)
        calibrate = data.pop("calibrate")
        permission = Permission.EDIT if calibrate else Permission.VIEW  # a calibration is a launch
        project = project_selectors.project_for(
            user=caller(request), project_id=data.pop("project"), permission=permission
        )
        run_request = RunRequest(project=project, **references(project, data))
        resolved, problems = run_problems(run_request)
        if problems:
            raise ValidationError(problems)
        launched = None
        if calibrate:
            _, launched = services.run_calibrate(request=run_request, by=caller(request))
        answer = estimates.run_estimate(
            tier=run_request.tier, method=run_request.method, resolved=resolved, steps=run_request.max_steps
        )
        if launched is not None:
            answer["calibration"]["launched"] = launched
        return Response(s.RunEstimateSerializer(answer).data)


class RunBudgetView(ApiView):
    @extend_schema(
        request=s.RunBudgetUpdateSerializer,
        responses=s.RunCostSerializer,
        summary="Set or raise the run's budget (owners); a run paused at its budget then resumes "
        "with runs/{id}/resume",
    )
    def patch(self, request: Request, id: int) -> Response:
        run = run_selectors.run_for(user=caller(request), run_id=id, permission=Permission.MANAGE)
        run = services.run_budget_set(run=run, **self.validated(s.RunBudgetUpdateSerializer, partial=True))
        return Response(s.RunCostSerializer(selectors.run_cost(run=run)).data)


class ProjectCostView(ApiView):
    @extend_schema(
        parameters=[s.PeriodSerializer],
        responses=s.ProjectCostSerializer,
        summary="The project's units and money recorded in [since, until): in all, per run, per user",
    )
    def get(self, request: Request, id: int) -> Response:
        project = project_selectors.project_for(user=caller(request), project_id=id)
        period = self.query(s.PeriodSerializer)
        return Response(s.ProjectCostSerializer(selectors.project_costs(project=project, **period)).data)


class ProjectBudgetView(ApiView):
    @extend_schema(
        responses=s.ProjectBudgetSerializer, summary="The project's monthly budget and this month's spend"
    )
    def get(self, request: Request, id: int) -> Response:
        project = project_selectors.project_for(user=caller(request), project_id=id)
        return Response(s.ProjectBudgetSerializer(selectors.project_budget_of(project=project)).data)

    @extend_schema(
        request=s.ProjectBudgetUpdateSerializer,
        responses=s.ProjectBudgetSerializer,
        summary="Set the project's monthly budget (owners); past it, new runs are refused",
    )
    def patch(self, request: Request, id: int) -> Response:
        project = project_selectors.project_for(
            user=caller(request), project_id=id, permission=Permission.MANAGE
        )
        services.project_budget_set(project=project, **self.validated(s.ProjectBudgetUpdateSerializer))
        return Response(s.ProjectBudgetSerializer(selectors.project_budget_of(project=project)).data)


class PriceListView(ApiView):
    @extend_schema(responses=s.PriceSerializer(many=True), summary="Every price, newest first")
    def get(self, request: Request) -> Response:
        caller(request)
        return self.paginated(selectors.prices(), s.PriceSerializer)

    @extend_schema(
        request=s.PriceCreateSerializer,
        responses={201: s.PriceSerializer},
        summary="Set a price from a moment on (staff); units recorded before it keep their price",
    )
    def post(self, request: Request) -> Response:
        if not caller(request).is_staff:
            raise PermissionDenied("only staff users (the operators) set prices")
        price = services.price_set(**self.validated(s.PriceCreateSerializer))
        return Response(s.PriceSerializer(price).data, status=201)
