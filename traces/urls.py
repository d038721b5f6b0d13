from django.urls import path

from traces import views

urlpatterns = [
    path("projects/<int:project_id>/traces/", views.trace_list, name="trace-list"),
    path("projects/<int:project_id>/traces/promote/", views.trace_promote, name="trace-promote"),
    path("traces/<int:trace_id>/", views.trace_detail, name="trace-detail"),
]
