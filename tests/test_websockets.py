"""The project websocket: who may connect, and the events it forwards after a commit."""

import json

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from core.roles import Role
from projects import services as project_services
from runs.consumers import CLOSE_NOT_FOUND, CLOSE_UNAUTHENTICATED
from webapp.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)
ORIGIN = (b"origin", b"http://127.0.0.1")


def headers_for(user) -> list[tuple[bytes, bytes]]:
    _, raw = project_services.api_token_create(user=user, name="ws")
    return [ORIGIN, (b"authorization", f"Bearer {raw}".encode())]


async def connect(path: str, headers):
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await communicator.connect(timeout=5)
    return communicator, connected, code


@pytest.mark.parametrize("role", [Role.OWNER, Role.LAUNCHER, Role.REVIEWER, Role.VIEWER])
def test_every_member_role_may_watch_its_project(team, role):
    headers = headers_for(team[role])

    async def scenario():
        communicator, connected, _ = await connect(f"/ws/projects/{team['project'].pk}/", headers)
        await communicator.disconnect()
        return connected

    assert async_to_sync(scenario)() is True


def test_a_user_of_another_project_is_refused_as_not_found(team):
    headers = headers_for(team["outsider"])

    async def scenario():
        return await connect(f"/ws/projects/{team['project'].pk}/", headers)

    _, connected, code = async_to_sync(scenario)()
    assert (connected, code) == (False, CLOSE_NOT_FOUND)


def test_an_anonymous_or_revoked_client_is_refused(team):
    token, raw = project_services.api_token_create(user=team[Role.OWNER], name="old")
    project_services.api_token_revoke(token=token)

    async def scenario(headers):
        return await connect(f"/ws/projects/{team['project'].pk}/", headers)

    for headers in ([ORIGIN], [ORIGIN, (b"authorization", f"Bearer {raw}".encode())]):
        _, connected, code = async_to_sync(scenario)(headers)
        assert (connected, code) == (False, CLOSE_UNAUTHENTICATED)


def test_an_import_is_announced_to_watchers_after_it_commits(team):
    project, viewer = team["project"], team[Role.VIEWER]
    headers = headers_for(viewer)
    task_set = project_services.task_set_create(project=project, name="live", by=team[Role.OWNER])
    lines = [(json.dumps({"id": "a", "prompt": "p", "reference": "r"}) + "\n").encode()]

    async def scenario():
        communicator, connected, _ = await connect(f"/ws/projects/{project.pk}/", headers)
        assert connected
        from channels.db import database_sync_to_async

        await database_sync_to_async(project_services.task_set_import)(
            task_set=task_set, stream=lines, file_format="jsonl", by=team[Role.OWNER]
        )
        message = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return message

    message = async_to_sync(scenario)()
    assert message == {
        "event": "task_set.version_created",
        "payload": {"task_set": task_set.pk, "version": 1, "items": 1},
    }


def test_deployments_on_other_redis_databases_do_not_hear_each_others_runs(settings):
    """Pub/sub channels ignore Redis' database number: the layer's prefix must carry it."""
    from channels_redis.pubsub import RedisPubSubChannelLayer
    from redis.connection import parse_url

    prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
    db = parse_url(settings.REDIS_URL).get("db", 0)
    assert prefix.endswith(f"-db{db}")
    ours = RedisPubSubChannelLayer(hosts=[settings.REDIS_URL], prefix=prefix)
    theirs = RedisPubSubChannelLayer(
        hosts=[settings.REDIS_URL], prefix=prefix.replace(f"-db{db}", f"-db{db + 1}")
    )

    async def scenario():
        import asyncio

        mine, other = await ours.new_channel(), await theirs.new_channel()
        await ours.group_add("run-1", mine)
        await theirs.group_add("run-1", other)
        await theirs.group_send("run-1", {"type": "run.message", "event": "metrics", "payload": {}})
        heard_other = await asyncio.wait_for(theirs.receive(other), timeout=5)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(ours.receive(mine), timeout=0.5)
        await ours.flush()
        await theirs.flush()
        return heard_other["event"]

    assert async_to_sync(scenario)() == "metrics"
