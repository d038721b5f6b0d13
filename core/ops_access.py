"""Who may read the detail of /healthz and /metrics: the operations token, or an allowed address.

Anyone gets /healthz's bare answer (`{"status": "ok"}` or `"degraded"`, 200 or 503), which is
what a load balancer or `curl -f` needs. The detail (database, Redis, workers by name, sandbox
checks) and the Prometheus metrics go only to a request bearing `Authorization: Bearer
<FLYWHEEL_OPS_TOKEN>` (generated once into FLYWHEEL_HOME/ops_token unless set) or coming from
an address in FLYWHEEL_OPS_ALLOW (networks, comma-separated; empty by default: behind a proxy
every request comes from the proxy's address).
"""

import hmac
import ipaddress

from django.conf import settings
from django.http import HttpRequest


def ops_allowed(request: HttpRequest) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), settings.FLYWHEEL_OPS_TOKEN):
        return True
    return address_allowed(request.META.get("REMOTE_ADDR", ""))


def address_allowed(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(network, strict=False) for network in settings.FLYWHEEL_OPS_ALLOW)
