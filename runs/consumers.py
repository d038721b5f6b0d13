"""Websockets: check the caller's role, join the project's or the run's group, forward its messages."""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from runs import selectors
from runs.events import project_group, run_group
from runs.models import Run
from runs.roles import Permission

# Close codes in the 4000 range are the application's; these mirror HTTP's meaning.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


@database_sync_to_async
def _role(user, project_id: int) -> str | None:
    role = selectors.role_of(user=user, project_id=project_id)
    return role if role is not None and selectors.role_allows(role, Permission.VIEW) else None


class ProjectConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        project_id = int(self.scope["url_route"]["kwargs"]["project_id"])
        if await _role(user, project_id) is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.group = project_group(project_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def project_event(self, message: dict) -> None:
        await self.send_json({"event": message["event"], "payload": message["payload"]})


@database_sync_to_async
def _run_project(run_id: int) -> int | None:
    return Run.objects.filter(pk=run_id).values_list("project_id", flat=True).first()


class RunConsumer(AsyncJsonWebsocketConsumer):
    """One run's live messages: status, event (alerts included), metrics, policy, rollout.

    Messages are notifications; a client re-fetches over REST on (re)connect."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        project_id = await _run_project(run_id)
        if project_id is None or await _role(user, project_id) is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.group = run_group(run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def run_message(self, message: dict) -> None:
        await self.send_json({"event": message["event"], "payload": message["payload"]})
