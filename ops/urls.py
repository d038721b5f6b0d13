from django.urls import path

from ops import views

urlpatterns = [
    path("ops/", views.ops_page, name="ops"),
]
