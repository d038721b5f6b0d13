from django.urls import path

from sweeps import pages

urlpatterns = [
    path("projects/<int:project_id>/sweeps/", pages.sweep_list, name="sweep-list"),
    path("sweeps/<int:sweep_id>/", pages.sweep_detail, name="sweep-detail"),
    path("sweeps/<int:sweep_id>/cancel/", pages.sweep_cancel, name="sweep-cancel"),
]
