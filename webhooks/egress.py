"""Where webhooks may be sent: public addresses only, unless FLYWHEEL_WEBHOOK_ALLOW_PRIVATE.

A webhook URL is chosen by a project's owner, and the POST leaves from a worker inside the
deployment's network. Without a check, an owner could aim it at what only that network reaches: the
metadata service (169.254.169.254), Redis or the database on 127.0.0.1, an internal admin page.

The check runs where the connection is made: the host name is resolved once, every address it has is
checked, and the socket connects to a checked address (so a name that resolves to a public address
for the check and a private one for the connection, DNS rebinding, gets nowhere). HTTPS still
verifies the certificate against the host name. Deliveries never go through a proxy: one would
connect on our behalf to an address we did not check.
"""

import http.client
import ipaddress
import socket
import urllib.request
from typing import Any

from django.conf import settings


class AddressRefusedError(OSError):
    """The webhook's host is, or resolves to, an address this deployment does not send to."""


def address_allowed(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Public (globally routable) addresses; any address with FLYWHEEL_WEBHOOK_ALLOW_PRIVATE.

    >>> address_allowed(ipaddress.ip_address("93.184.216.34"))
    True
    >>> [address_allowed(ipaddress.ip_address(a)) for a in ("10.0.0.1", "169.254.169.254", "::1")]
    [False, False, False]
    """
    if settings.FLYWHEEL_WEBHOOK_ALLOW_PRIVATE:
        return True
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def literal_address_problem(host: str) -> str | None:
    """Why a host that is an IP address (or `localhost`) cannot receive webhooks, or None. Names are
    checked when a delivery is sent, as what they resolve to may change."""
    if host.lower() in ("localhost", "localhost.localdomain") or host.lower().endswith(".localhost"):
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if address_allowed(address):
        return None
    return f"points to {address}, a private address (FLYWHEEL_WEBHOOK_ALLOW_PRIVATE=true allows those)"


# http.client passes this sentinel for "no timeout given"; the stubs keep it private.
_DEFAULT_TIMEOUT: Any = getattr(socket, "_GLOBAL_DEFAULT_TIMEOUT")  # noqa: B009


def checked_connection(
    address: tuple[str, int], timeout: Any = _DEFAULT_TIMEOUT, source_address: Any = None
) -> socket.socket:
    """`socket.create_connection`, to a checked address of the host only."""
    host, port = address
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    for *_, sockaddr in infos:
        resolved = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if not address_allowed(resolved):
            raise AddressRefusedError(
                f"{host} resolves to {resolved}, a private address; webhooks go to public ones "
                "(FLYWHEEL_WEBHOOK_ALLOW_PRIVATE=true allows private ones)"
            )
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            if timeout is not _DEFAULT_TIMEOUT:
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error or OSError(f"{host} has no address")


class _CheckedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = checked_connection


class _CheckedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = checked_connection  # TLS then wraps it, for the host name


class _CheckedHTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(_CheckedHTTPConnection, req)


class _CheckedHTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(_CheckedHTTPSConnection, req, context=self._context)  # type: ignore[attr-defined]


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # A 3xx is the receiver's answer, not a hop: the signature was made for this URL, and a
    # redirected POST would turn into a GET without its body.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


opener = urllib.request.build_opener(
    urllib.request.ProxyHandler({}), _NoRedirects, _CheckedHTTPHandler, _CheckedHTTPSHandler
)
