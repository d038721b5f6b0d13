"""ASGI entry point: HTTP through Django, websockets through Channels with session or token auth."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django_asgi_app = get_asgi_application()

from django.urls import get_resolver  # noqa: E402

# Import every view now, not on the first request: concurrent first requests imported the URLconf
# on several threads at once, and Python's import-deadlock escape handed one of them a half-made
# module (`cannot import name 'viewsets' from 'rest_framework'`, a 500), seen in `make bench-api`.
get_resolver().url_patterns  # noqa: B018

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from core.limits import BodyLimitMiddleware  # noqa: E402
from core.ws_auth import OriginValidatorUnlessBearer, SessionOrTokenAuthMiddleware  # noqa: E402
from projects.selectors import user_for_token  # noqa: E402
from runs.consumers import OutageGuard  # noqa: E402
from runs.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": BodyLimitMiddleware(django_asgi_app),
        "websocket": OriginValidatorUnlessBearer(
            SessionOrTokenAuthMiddleware(
                OutageGuard(URLRouter(websocket_urlpatterns)),
                user_for_digest=lambda digest: user_for_token(digest=digest),
            )
        ),
    }
)
