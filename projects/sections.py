"""The parts of the project pages that apps built on projects own: the runs table and tiers (runs),
the reward rules (rewards). Each app registers its section when it loads (its AppConfig.ready); a
page merges what its sections return into its context, so projects imports none of those apps."""

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest

from projects.models import Project

ProjectSection = Callable[[HttpRequest, Project], dict[str, Any]]
HomeSection = Callable[[HttpRequest], dict[str, Any]]

PROJECT_PAGE: list[ProjectSection] = []
HOME_PAGE: list[HomeSection] = []


def project_section_register(section: ProjectSection) -> None:
    if section not in PROJECT_PAGE:
        PROJECT_PAGE.append(section)


def home_section_register(section: HomeSection) -> None:
    if section not in HOME_PAGE:
        HOME_PAGE.append(section)


def project_sections(request: HttpRequest, project: Project) -> dict[str, Any]:
    context: dict[str, Any] = {}
    for section in PROJECT_PAGE:
        context |= section(request, project)
    return context


def home_sections(request: HttpRequest) -> dict[str, Any]:
    context: dict[str, Any] = {}
    for section in HOME_PAGE:
        context |= section(request)
    return context
