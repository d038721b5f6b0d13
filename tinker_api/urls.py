"""The Tinker API's routes, included at /tinker/ (the SDK's base_url) as the SDK names them."""

from django.urls import path, re_path

from tinker_api import api

SESSION = r"(?P<session_id>[A-Za-z0-9-]{1,64})"
MODEL = r"(?P<model_id>[A-Za-z0-9:-]{1,120})"
CHECKPOINT = r"(?P<kind>weights|sampler_weights)/(?P<name>[A-Za-z0-9._-]{1,200})"

urlpatterns = [
    path("api/v1/healthz", api.healthz, name="tinker-healthz"),
    path("api/v1/client/config", api.client_config, name="tinker-client-config"),
    path("api/v1/client/dynamic_config", api.client_dynamic_config, name="tinker-client-dynamic-config"),
    path("api/v1/telemetry", api.telemetry, name="tinker-telemetry"),
    path("api/v1/get_server_capabilities", api.server_capabilities, name="tinker-capabilities"),
    path("api/v1/create_session", api.create_session, name="tinker-create-session"),
    path("api/v1/session_heartbeat", api.session_heartbeat, name="tinker-heartbeat"),
    re_path(rf"^api/v1/sessions/{SESSION}$", api.session_detail, name="tinker-session"),
    re_path(rf"^api/v1/sessions/{SESSION}/finish$", api.session_finish, name="tinker-session-finish"),
    path("api/v1/create_model", api.create_model, name="tinker-create-model"),
    path("api/v1/get_info", api.get_info, name="tinker-get-info"),
    path("api/v1/forward_backward", api.forward_backward, name="tinker-forward-backward"),
    path("api/v1/optim_step", api.optim_step, name="tinker-optim-step"),
    path("api/v1/save_weights", api.save_weights, name="tinker-save-weights"),
    path("api/v1/save_weights_for_sampler", api.save_weights_for_sampler, name="tinker-save-for-sampler"),
    path("api/v1/load_weights", api.load_weights, name="tinker-load-weights"),
    path("api/v1/training_runs", api.training_runs, name="tinker-training-runs"),
    path("api/v1/sessions", api.sessions, name="tinker-sessions"),
    path("api/v1/checkpoints", api.user_checkpoints, name="tinker-user-checkpoints"),
    path("api/v1/weights_info", api.weights_info, name="tinker-weights-info"),
    path("api/v1/cancel_future", api.cancel_future, name="tinker-cancel-future"),
    re_path(rf"^api/v1/training_runs/{MODEL}$", api.training_run, name="tinker-training-run"),
    re_path(rf"^api/v1/training_runs/{MODEL}/checkpoints$", api.checkpoints, name="tinker-checkpoints"),
    re_path(
        rf"^api/v1/training_runs/{MODEL}/checkpoints/{CHECKPOINT}$",
        api.checkpoint_delete,
        name="tinker-checkpoint",
    ),
    re_path(
        rf"^api/v1/training_runs/{MODEL}/checkpoints/{CHECKPOINT}/publish$",
        api.checkpoint_publish,
        name="tinker-checkpoint-publish",
    ),
    re_path(
        rf"^api/v1/training_runs/{MODEL}/checkpoints/{CHECKPOINT}/ttl$",
        api.checkpoint_ttl,
        name="tinker-checkpoint-ttl",
    ),
    re_path(
        r"^api/v1/samplers/(?P<sampler_id>[A-Za-z0-9-]{1,64})$", api.sampler_detail, name="tinker-sampler"
    ),
    path("api/v1/create_sampling_session", api.create_sampling_session, name="tinker-create-sampler"),
    path("api/v1/asample", api.asample, name="tinker-asample"),
    path("api/v1/retrieve_future", api.retrieve_future, name="tinker-retrieve-future"),
]
