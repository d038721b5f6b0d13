"""The operations overview over REST: what the operations page shows, as JSON."""

from django.core.exceptions import PermissionDenied
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from core.callers import caller
from core.views import ApiView
from ops import selectors
from ops import serializers as s

REFUSED = "the operations overview is for project owners and staff"


class OverviewView(ApiView):
    @extend_schema(
        responses=s.OverviewSerializer,
        summary="Workers, queues, Redis, the database, sandboxes and recent failures (owners and staff)",
    )
    def get(self, request: Request) -> Response:
        if not selectors.ops_may_view(caller(request)):
            raise PermissionDenied(REFUSED)
        return Response(selectors.ops_overview(user=caller(request)))
