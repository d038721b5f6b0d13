"""The base of every REST view: the one error shape whatever the endpoint renders, validated bodies
and query strings with 64-bit bounds, newest-first cursor pages."""

from django.db.models import QuerySet
from rest_framework import serializers
from rest_framework.pagination import BasePagination
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import NewestFirstCursorPagination, bounded_integers
from core.schema import FlywheelAutoSchema


class ApiView(APIView):
    schema = FlywheelAutoSchema()
    # Read by the schema generator; None on a view that answers a plain list.
    pagination_class: type[BasePagination] | None = NewestFirstCursorPagination

    def finalize_response(self, request: Request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if isinstance(response, Response) and response.status_code >= 400:
            # An error is the one JSON error shape, whatever the endpoint streams when it succeeds.
            response.accepted_renderer = JSONRenderer()
            response.accepted_media_type = JSONRenderer.media_type
        return response

    def validated(self, serializer_class: type[serializers.Serializer], partial: bool = False) -> dict:
        serializer = bounded_integers(serializer_class(data=self.request.data, partial=partial))
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data

    def query(self, serializer_class: type[serializers.Serializer]) -> dict:
        serializer = bounded_integers(serializer_class(data=self.request.query_params))
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data

    def paginated(
        self,
        queryset: QuerySet,
        serializer_class: type[serializers.Serializer],
        pagination: type[NewestFirstCursorPagination] = NewestFirstCursorPagination,
    ) -> Response:
        paginator = pagination()
        page = paginator.paginate_queryset(queryset, self.request, view=self)
        return paginator.get_paginated_response(serializer_class(page, many=True).data)
