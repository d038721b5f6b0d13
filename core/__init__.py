"""The API core: the base API view, roles and permissions, token and websocket auth, errors,
idempotency, leases, throttling, strict JSON, streaming and encryption. It imports no domain app;
every domain app builds on it."""
