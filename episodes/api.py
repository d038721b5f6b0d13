"""Episodes over REST: an agent outside Flywheel takes an episode of a running `external_rollouts`
run (a task and an id), plays it against `run-<id>` on /v1/chat/completions with the id in the
`X-Flywheel-Episode` header, and reports its outcome. Launchers (EDIT) play; members read."""

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from core.callers import caller
from core.exceptions import StateError, error_body
from core.roles import Permission
from core.views import ApiView
from episodes import selectors, services
from episodes import serializers as s
from episodes.models import Episode
from runs import selectors as run_selectors
from runs.learners import plays_external
from runs.models import Run

RETRY_SECONDS = 2


def _external_run(request: Request, run_id: int, permission: str) -> Run:
    run = run_selectors.run_for(user=caller(request), run_id=run_id, permission=permission)
    if not plays_external(run.method):
        raise StateError(f"run {run.pk} is a {run.method} run; episodes are played by external_rollouts runs")
    return run


def _episode(request: Request, run_id: int, key: str, permission: str) -> Episode:
    run = _external_run(request, run_id, permission)
    try:
        return selectors.episode_for(user=caller(request), run=run, key=key)
    except (Episode.DoesNotExist, DjangoValidationError):
        raise NotFound(f"run {run.pk} has no episode {key}") from None


class EpisodeListView(ApiView):
    @extend_schema(
        parameters=[s.EpisodeListQuerySerializer],
        responses=s.EpisodeSerializer(many=True),
        summary="The run's episodes, newest first",
    )
    def get(self, request: Request, id: int) -> Response:
        run = run_selectors.run_for(user=caller(request), run_id=id)  # another method's: none
        query = self.query(s.EpisodeListQuerySerializer)
        episodes = selectors.episodes_of(run=run, status=query.get("status")).select_related(
            "batch", "trajectory"
        )
        return self.paginated(episodes, s.EpisodeSerializer)

    @extend_schema(
        request=None,
        responses={201: s.EpisodeSerializer},
        summary="Take the next episode to play: a task, and the id its /v1 calls and outcome carry "
        "(409 with Retry-After when every episode of the open batches is being played)",
    )
    def post(self, request: Request, id: int) -> Response:
        run = _external_run(request, id, Permission.EDIT)
        try:
            episode = services.episode_start(run=run, user=caller(request))
        except services.NoEpisodeError as exc:
            response = Response(error_body(409, str(exc)), status=status.HTTP_409_CONFLICT)
            response["Retry-After"] = str(RETRY_SECONDS)
            return response
        return Response(s.EpisodeSerializer(episode).data, status=status.HTTP_201_CREATED)


class EpisodeCountsView(ApiView):
    @extend_schema(
        responses=s.EpisodeCountsSerializer, summary="How many of the run's episodes are in each state"
    )
    def get(self, request: Request, id: int) -> Response:
        run = run_selectors.run_for(user=caller(request), run_id=id)
        return Response(s.EpisodeCountsSerializer(selectors.episode_counts(run=run)).data)


class EpisodeDetailView(ApiView):
    @extend_schema(responses=s.EpisodeSerializer, summary="One episode")
    def get(self, request: Request, id: int, key: str) -> Response:
        return Response(s.EpisodeSerializer(_episode(request, id, key, Permission.VIEW)).data)


class EpisodeOutcomeView(ApiView):
    @extend_schema(
        request=s.OutcomeSerializer,
        responses=s.EpisodeSerializer,
        summary="End the episode: its reward (and components), or a final answer the run's reward rule "
        "scores; once (a second report is refused)",
    )
    def post(self, request: Request, id: int, key: str) -> Response:
        episode = _episode(request, id, key, Permission.EDIT)
        outcome = self.validated(s.OutcomeSerializer)
        episode = services.episode_report(
            episode=episode,
            reward=outcome.get("reward"),
            components=outcome.get("components"),
            final=outcome.get("final"),
        )
        episode.refresh_from_db()
        return Response(s.EpisodeSerializer(episode).data)
