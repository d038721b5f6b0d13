"""The tiers' pages: a tier's form, page and deletion, and its evaluations."""

from django.urls import path

from tiers import views

urlpatterns = [
    path("projects/<int:project_id>/tiers/new/", views.tier_create, name="tier-create"),
    path("tiers/<int:tier_id>/", views.tier_detail, name="tier-detail"),
    path("tiers/<int:tier_id>/edit/", views.tier_edit, name="tier-edit"),
    path("tiers/<int:tier_id>/delete/", views.tier_delete, name="tier-delete"),
    path("tiers/<int:tier_id>/evaluate/", views.tier_evaluate, name="tier-evaluate"),
    path(
        "tier-evaluations/<int:evaluation_id>/", views.tier_evaluation_detail, name="tier-evaluation-detail"
    ),
]
