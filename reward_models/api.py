"""Reward models over REST: list and create them, train a version on a task-set version's pairs,
read and cancel a version, and which versions a run's rewards used. Thin: selectors check the
role (VIEW to read, EDIT to create, train and cancel), services the rules."""

from django.core.exceptions import ValidationError
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from core.api import idempotent
from core.callers import caller
from core.roles import Permission
from core.schema import NO_CONTENT
from core.views import ApiView
from projects import selectors as project_selectors
from projects.models import TaskSetVersion
from projects.serializers import ProjectFilterSerializer
from reward_models import scoring, selectors, services
from reward_models import serializers as s
from runs import selectors as run_selectors
from tiers.models import Tier


class RewardModelListView(ApiView):
    @extend_schema(parameters=[ProjectFilterSerializer], responses=s.RewardModelSerializer(many=True))
    def get(self, request: Request) -> Response:
        reward_models = selectors.reward_models_for(user=caller(request))
        if (project := self.query(ProjectFilterSerializer).get("project")) is not None:
            reward_models = reward_models.filter(project_id=project)
        return self.paginated(reward_models, s.RewardModelSerializer)

    @extend_schema(
        request=s.RewardModelCreateSerializer,
        responses={201: s.RewardModelSerializer},
        summary="Create a reward model (owners and launchers); train its versions with /train",
    )
    @idempotent
    def post(self, request: Request) -> Response:
        data = self.validated(s.RewardModelCreateSerializer)
        project = project_selectors.project_for(
            user=caller(request), project_id=data.pop("project"), permission=Permission.EDIT
        )
        reward_model = services.reward_model_create(project=project, by=caller(request), **data)
        return Response(s.RewardModelSerializer(reward_model).data, status=201)


class RewardModelDetailView(ApiView):
    @extend_schema(responses=s.RewardModelSerializer)
    def get(self, request: Request, id: int) -> Response:
        reward_model = selectors.reward_model_for(user=caller(request), reward_model_id=id)
        return Response(s.RewardModelSerializer(reward_model).data)

    @extend_schema(
        responses=NO_CONTENT, summary="Delete a reward model no run has used and none trains (else 409)"
    )
    def delete(self, request: Request, id: int) -> Response:
        reward_model = selectors.reward_model_for(
            user=caller(request), reward_model_id=id, permission=Permission.EDIT
        )
        services.reward_model_delete(reward_model=reward_model)
        return Response(status=204)


class RewardModelVersionListView(ApiView):
    @extend_schema(responses=s.RewardModelVersionSerializer(many=True), summary="A reward model's versions")
    def get(self, request: Request, id: int) -> Response:
        reward_model = selectors.reward_model_for(user=caller(request), reward_model_id=id)
        return self.paginated(reward_model.versions.all(), s.RewardModelVersionSerializer)


class RewardModelTrainView(ApiView):
    @extend_schema(
        request=s.RewardModelTrainSerializer,
        responses={201: s.RewardModelVersionSerializer},
        summary="Train a new version on a task-set version's preference pairs, from a base model or a "
        "tier's (owners and launchers); a version without pairs the learner can read is refused",
    )
    @idempotent
    def post(self, request: Request, id: int) -> Response:
        reward_model = selectors.reward_model_for(
            user=caller(request), reward_model_id=id, permission=Permission.EDIT
        )
        data = self.validated(s.RewardModelTrainSerializer)
        project = reward_model.project
        task_set_version = TaskSetVersion.objects.filter(
            pk=data["task_set_version"], task_set__project=project
        ).first()
        if task_set_version is None:
            missing = f"no task-set version {data['task_set_version']} in project {project.name}"
            raise ValidationError({"task_set_version": missing})
        tier = None
        if "tier" in data:
            tier = Tier.objects.filter(pk=data["tier"], project=project).first()
            if tier is None:
                raise ValidationError({"tier": f"no tier {data['tier']} in project {project.name}"})
        version = services.reward_model_train(
            reward_model=reward_model,
            task_set_version=task_set_version,
            by=caller(request),
            base_model=data["base_model"],
            tier=tier,
            hyperparameters=data["hyperparameters"],
        )
        return Response(s.RewardModelVersionSerializer(version).data, status=201)


class RewardModelVersionDetailView(ApiView):
    @extend_schema(
        responses=s.RewardModelVersionSerializer,
        summary="A version: status, progress, held-out pair accuracy (trained, and with the fresh head)",
    )
    def get(self, request: Request, id: int) -> Response:
        return Response(
            s.RewardModelVersionSerializer(selectors.version_for(user=caller(request), version_id=id)).data
        )


class RewardModelVersionCancelView(ApiView):
    @extend_schema(
        request=None,
        responses=s.RewardModelVersionSerializer,
        summary="Cancel a queued or running training (owners and launchers); otherwise 409",
    )
    def post(self, request: Request, id: int) -> Response:
        version = selectors.version_for(user=caller(request), version_id=id, permission=Permission.EDIT)
        return Response(
            s.RewardModelVersionSerializer(services.reward_model_version_cancel(version=version)).data
        )


class RewardModelScoreView(ApiView):
    @extend_schema(
        request=s.RewardModelScoreSerializer,
        responses=s.RewardModelScoresSerializer,
        summary="Score texts ({prompt, completion}) or rank pairs ({prompt, chosen, rejected}) with a "
        f"trained version, at most {s.SCORE_MAX_ROWS} a request; stores nothing. The model runs in the "
        "web process, so it needs the edit permission (owners and launchers); a version not trained "
        "answers 409",
    )
    def post(self, request: Request, id: int, number: int) -> Response:
        reward_model = selectors.reward_model_for(
            user=caller(request), reward_model_id=id, permission=Permission.EDIT
        )
        version = selectors.version_of(reward_model=reward_model, number=number)
        data = self.validated(s.RewardModelScoreSerializer)
        result = scoring.version_score(version=version, texts=data.get("texts"), pairs=data.get("pairs"))
        return Response(s.RewardModelScoresSerializer(result).data)


class RunRewardModelsView(ApiView):
    @extend_schema(
        responses=s.RunRewardModelSerializer(many=True),
        summary="The reward-model versions a run's rewards used (pinned when it first scored)",
    )
    def get(self, request: Request, id: int) -> Response:
        run = run_selectors.run_for(user=caller(request), run_id=id)
        return self.paginated(selectors.uses_of_run(run=run), s.RunRewardModelSerializer)
