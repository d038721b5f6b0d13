"""Shared fixtures: users, projects with a member of each role, and REST clients."""

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from core.roles import Role
from projects import services as project_services
from projects.models import Project
from runs import services
from webapp import stack
from webapp.embedded_redis import redis_start

# A learner algorithm registers when its module is imported; --doctest-modules would import this
# one for the whole session. tests/test_learner_registry.py imports it, and unregisters it after.
collect_ignore = ["toy_reinforce.py"]


@pytest.fixture(scope="session", autouse=True)
def unpooled_broker_connections():
    """Tests fork live servers (ChannelsLiveServerTestCase) from this process. A pooled broker
    connection inherited by a fork is closed by kombu's after-fork hook, which can block forever on
    a reply the parent already read; without a pool, nothing is inherited."""
    from kombu import pools

    from webapp.celery import app

    app.conf.broker_pool_limit = 0
    pools.set_limit(0)


def pytest_sessionfinish(session, exitstatus):
    """Never hang at exit on a forked helper process that did not stop."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()


@pytest.fixture(scope="session", autouse=True)
def redis_server():
    """On the embedded default the tests use the same private Redis that `make up` starts: started
    here when none runs, and then stopped at the end (a running one, `make up`'s, is left alone)."""
    started = settings.EMBEDDED_REDIS and redis_start(
        home=settings.FLYWHEEL_HOME, port=settings.FLYWHEEL_REDIS_PORT
    )
    yield
    if started:
        stack.process_stop("redis")


@pytest.fixture(scope="session", autouse=True)
def static_files_uncollected(tmp_path_factory):
    """Pages link the static files under their plain names, served from static/ as they are in the
    checkout: a `collectstatic` that `make up` ran in the same FLYWHEEL_HOME may be older than them
    (tests/test_ui_shell_browser.py collects its own)."""
    from django.contrib.staticfiles.storage import staticfiles_storage
    from django.utils.functional import empty

    settings.STATIC_ROOT = str(tmp_path_factory.mktemp("static"))
    staticfiles_storage._wrapped = empty


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """Tests create many users; the production hasher is slow on purpose."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def made_up_hub_models(settings):
    """Tests give tiers made-up hub ids (org/model) they never load; whether a hub id can be
    loaded is checked at creation, and tested on its own (tests/test_bad_input.py)."""
    settings.FLYWHEEL_HUB_CHECK = False


@pytest.fixture(autouse=True)
def no_sign_in_lockout_carried_over():
    """Every test client comes from 127.0.0.1: a few failed sign-ins per test must not add up,
    over a suite or its reruns, into a lockout of later tests (core/lockout.py)."""
    yield
    from core import lockout

    lockout.forget("127.0.0.1")


def make_user(username: str, password: str = "pw-123456"):
    return services.User.objects.create_user(username=username, password=password)


def make_project(owner, name: str = "alpha") -> Project:
    return project_services.project_create(name=name, by=owner)


@pytest.fixture
def team(db):
    """A project with one user per role, and an outsider who belongs to another project."""
    owner = make_user("owner")
    project = make_project(owner)
    members = {Role.OWNER: owner}
    for role in (Role.LAUNCHER, Role.REVIEWER, Role.VIEWER):
        user = make_user(str(role))
        project_services.member_add(project=project, username=user.username, role=role)
        members[role] = user
    outsider = make_user("outsider")
    other = make_project(outsider, name="beta")
    return {"project": project, "other_project": other, "outsider": outsider, **members}


def api_client_for(user) -> APIClient:
    """A client that authenticates the way REST clients do: with a bearer token."""
    _, raw = project_services.api_token_create(user=user, name="tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client
