from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from runs import selectors


@login_required
def project_list(request: HttpRequest) -> HttpResponse:
    return render(request, "runs/project_list.html", {"projects": selectors.projects_of(user=request.user)})
