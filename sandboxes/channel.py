"""The host end of the fork server's protocol: framed JSON headers with a binary payload.

A frame is two big-endian u32 lengths (header, payload), the JSON header, then the payload. The
server answers each request with exactly one frame. Every read has a deadline; a server that stops
answering or closes the stream is an infrastructure failure.
"""

import json
import os
import select
import socket
import struct
import time
from collections import deque
from typing import Protocol

from .interface import InfrastructureError, SandboxPathError

HEADER = struct.Struct(">II")
DOCKER_FRAME = struct.Struct(">BxxxI")


class Transport:
    """A byte stream to the server: send bytes, receive exactly n bytes before a deadline."""

    def send(self, data: bytes) -> None:
        raise NotImplementedError

    def recv_exact(self, size: int, deadline: float) -> bytes:
        raise NotImplementedError

    def diagnostics(self) -> str:
        return ""

    def close(self) -> None:
        raise NotImplementedError


class Stream(Protocol):
    """What PipeTransport needs of a pipe or a socket: its descriptor, and closing it."""

    def fileno(self) -> int: ...

    def close(self) -> None: ...


class PipeTransport(Transport):
    """The server's stdin and stdout as pipes (bubblewrap), or one unix socket for both (Docker)."""

    def __init__(self, writer: Stream, reader: Stream, log_path: str = "") -> None:
        self.writer = writer
        self.reader = reader
        self.write_fd = writer.fileno()
        self.read_fd = reader.fileno()
        self.log_path = log_path
        self.buffer = bytearray()
        self.poller = select.poll()
        self.poller.register(self.read_fd, select.POLLIN)

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.write_fd, view) :]
        except OSError as exc:
            raise InfrastructureError(f"sandbox server is gone: {exc}") from None

    def recv_exact(self, size: int, deadline: float) -> bytes:
        while len(self.buffer) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.poller.poll(remaining * 1000):
                raise InfrastructureError("sandbox server did not answer in time")
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise InfrastructureError("sandbox server closed its channel" + self.diagnostics())
            self.buffer += chunk
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def diagnostics(self) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as handle:
                tail = handle.read()[-2000:].decode(errors="replace").strip()
        except OSError:
            return ""
        return f": {tail}" if tail else ""

    def close(self) -> None:
        for stream in (self.writer, self.reader):
            try:
                stream.close()
            except OSError:
                pass


class DockerAttachTransport(Transport):
    """A container's attached stdin/stdout; the engine multiplexes stdout and stderr into frames."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.raw = bytearray()
        self.stdout = bytearray()
        self.stderr: deque[bytes] = deque(maxlen=32)

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise InfrastructureError(f"sandbox container is gone: {exc}") from None

    def recv_exact(self, size: int, deadline: float) -> bytes:
        while len(self.stdout) < size:
            self.demux()
            if len(self.stdout) >= size:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise InfrastructureError("sandbox container did not answer in time")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                raise InfrastructureError("sandbox container did not answer in time") from None
            except OSError as exc:
                raise InfrastructureError(f"sandbox container channel failed: {exc}") from None
            if not chunk:
                raise InfrastructureError("sandbox container closed its channel" + self.diagnostics())
            self.raw += chunk
        data = bytes(self.stdout[:size])
        del self.stdout[:size]
        return data

    def demux(self) -> None:
        while len(self.raw) >= DOCKER_FRAME.size:
            stream, length = DOCKER_FRAME.unpack_from(self.raw)
            if len(self.raw) < DOCKER_FRAME.size + length:
                return
            payload = bytes(self.raw[DOCKER_FRAME.size : DOCKER_FRAME.size + length])
            del self.raw[: DOCKER_FRAME.size + length]
            if stream == 1:
                self.stdout += payload
            else:
                self.stderr.append(payload)

    def diagnostics(self) -> str:
        tail = b"".join(self.stderr)[-2000:].decode(errors="replace").strip()
        return f": {tail}" if tail else ""

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Channel:
    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def receive(self, deadline: float) -> tuple[dict, bytes]:
        head_len, blob_len = HEADER.unpack(self.transport.recv_exact(HEADER.size, deadline))
        head = json.loads(self.transport.recv_exact(head_len, deadline))
        return head, self.transport.recv_exact(blob_len, deadline)

    def call(self, head: dict, blob: bytes = b"", *, timeout: float) -> tuple[dict, bytes]:
        raw = json.dumps(head).encode()
        self.transport.send(HEADER.pack(len(raw), len(blob)) + raw + blob)
        reply, out = self.receive(time.monotonic() + timeout)
        error = reply.get("error")
        if error == "path":
            raise SandboxPathError(reply["message"])
        if error == "not_found":
            raise FileNotFoundError(reply["message"])
        if error:
            raise InfrastructureError(f"sandbox server failed on {head['op']}: {reply.get('message', error)}")
        return reply, out
