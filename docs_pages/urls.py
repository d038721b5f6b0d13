"""The documentation pages: /docs/ and its pictures, and the README's old address."""

from django.urls import path

from docs_pages import views

urlpatterns = [
    path("readme/", views.readme, name="readme"),
    path("docs/", views.docs_page, name="docs-page"),
    path("docs/assets/<path:name>", views.docs_asset, name="docs-asset"),
    path("docs/<path:name>/", views.docs_page, name="docs-page"),
]
