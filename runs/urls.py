from django.urls import path

from runs import views

urlpatterns = [
    path("", views.project_list, name="project-list"),
]
