"""The web server: Daphne, with request bodies bounded before they are read.

`python -m webapp.serve` takes Daphne's own arguments. Daphne receives a whole request body (to a
temporary file) and then queues all of it in memory for the application, so a limit enforced by
the application alone comes too late: one 216 MB POST, even unauthenticated, grew the process by
1.7 GB. Here each request checks its declared length as soon as its headers are in (and counts a
chunked body as it arrives): over the limit (`webapp.limits.body_limit`), it answers 413 in the
API's error shape, keeps nothing of the body, and closes the connection.
"""

import io
import os

from daphne.cli import CommandLineInterface
from daphne.http_protocol import HTTPFactory, WebRequest
from daphne.server import Server
from twisted.internet import reactor

# The client is still sending when it is refused: the rest is read and dropped for a moment, so
# it sees the answer instead of a reset connection, then the connection is closed.
LINGER_SECONDS = 5.0


class BoundedRequest(WebRequest):
    refused = False
    received = 0

    def __init__(self, *args, **kwargs) -> None:
        # Twisted would read a whole form or multipart body into memory to parse it into `args`,
        # which Daphne never uses (and answer a bad one with an empty 400): Django parses bodies.
        super().__init__(*args, parsePOSTFormSubmission=False, **kwargs)

    def gotLength(self, length: int | None) -> None:  # noqa: N802 (Twisted's name)
        from webapp.limits import body_limit

        self.content_type = (self.requestHeaders.getRawHeaders(b"content-type") or [b""])[0].decode("latin-1")
        self.limit = body_limit(self.content_type)
        if length is not None and length > self.limit:
            self.content = io.BytesIO()  # Twisted closes it with the connection
            self.refuse(length)
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:  # noqa: N802 (Twisted's name)
        if self.refused:
            return  # dropped, never stored
        self.received += len(data)
        if self.received > self.limit:
            self.content.close()
            self.refuse(None)
            return
        super().handleContentChunk(data)

    def process(self) -> None:
        if self.refused:
            self.channel.loseConnection()
            return
        super().process()

    def refuse(self, length: int | None) -> None:
        from webapp.limits import too_large_body

        self.refused = True
        # No "100 Continue": a client waiting for it sends nothing more.
        self.requestHeaders.removeHeader(b"expect")
        body = too_large_body(self.content_type, length)
        head = (
            b"HTTP/1.1 413 Content Too Large\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n"
            b"Connection: close\r\n\r\n"
        )
        self.channel.transport.write(head + body)
        reactor.callLater(LINGER_SECONDS, self.channel.transport.loseConnection)


class BoundedHTTPFactory(HTTPFactory):
    def buildProtocol(self, addr):  # noqa: N802 (Twisted's name)
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = BoundedRequest
        return protocol


class BoundedServer(Server):
    """Daphne's server with BoundedRequest for every HTTP request.

    Daphne builds its HTTP factory inside run(); assigning it goes through this property, which
    puts the bounded factory in its place.
    """

    @property
    def http_factory(self) -> HTTPFactory:
        return self._bounded_http_factory

    @http_factory.setter
    def http_factory(self, factory: HTTPFactory) -> None:
        self._bounded_http_factory = BoundedHTTPFactory(self)


class BoundedCommandLineInterface(CommandLineInterface):
    server_class = BoundedServer


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    BoundedCommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
