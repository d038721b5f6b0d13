from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from core.lockout import LockoutAuthenticationForm
from webapp import health, metrics

urlpatterns = [
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(authentication_form=LockoutAuthenticationForm),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path(
        "api/v1/docs/",
        SpectacularSwaggerSplitView.as_view(url_name="api-schema", template_name="api_docs.html"),
        name="api-docs",
    ),
    path("api/v1/", include("projects.api_urls")),
    path("api/v1/", include("tiers.api_urls")),
    path("api/v1/", include("runs.api_urls")),
    path("api/v1/", include("rewards.api_urls")),
    path("api/v1/", include("reviews.api_urls")),
    path("api/v1/", include("webhooks.api_urls")),
    path("api/v1/", include("traces.api_urls")),
    path("api/v1/", include("reward_models.api_urls")),
    path("api/v1/", include("evaluations.api_urls")),
    path("v1/", include("finetuning.urls")),  # OpenAI's fine-tuning API, before the catch-all below
    path("api/v1/", include("ops.api_urls")),
    path("api/v1/", include("costs.api_urls")),
    path("api/v1/", include("episodes.api_urls")),
    path("api/v1/", include("sweeps.api_urls")),
    path("otlp/", include("traces.otlp_urls")),  # OTLP/HTTP: its own contract, not in the schema
    path("tinker/", include("tinker_api.urls")),  # the Tinker SDK's API: its own contract, not in the schema
    path("v1/", include("serving.openai_urls")),  # OpenAI-compatible: its own contract, not in the schema
    path("", include("rewards.urls")),
    path("", include("reviews.urls")),
    path("", include("webhooks.urls")),
    path("", include("traces.urls")),
    path("", include("reward_models.urls")),
    path("", include("evaluations.urls")),
    path("", include("sweeps.urls")),
    path("", include("ops.urls")),
    path("", include("projects.urls")),
    path("", include("tiers.urls")),
    path("", include("runs.urls")),
    path("", include("serving.urls")),
    path("", include("docs_pages.urls")),
]

handler400 = "core.errors.bad_request"
handler404 = "core.errors.not_found"
handler500 = "core.errors.server_error"
