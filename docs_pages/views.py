"""The documentation pages inside the app (`/docs/`), for every signed-in user."""

from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from docs_pages.site import API_REFERENCE, PageNotFoundError, asset_path, navigation, page_exists, render_page


@login_required
@require_GET
def docs_page(request: HttpRequest, name: str = "") -> HttpResponse:
    name = name.strip("/")
    if name == API_REFERENCE and not page_exists(name):
        # The generated reference is built by `make docs`; the live server has the interactive one.
        return redirect("api-docs")
    try:
        page = render_page(name)
    except PageNotFoundError as missing:
        raise Http404(f"No documentation page {missing}") from None
    return render(request, "docs_pages/docs_page.html", {"page": page, "navigation": navigation()})


@login_required
@require_GET
def docs_asset(request: HttpRequest, name: str) -> FileResponse:
    try:
        path, content_type = asset_path(name)
    except PageNotFoundError:
        raise Http404("No such picture in the documentation") from None
    return FileResponse(path.open("rb"), content_type=content_type)


@login_required
@require_GET
def readme(request: HttpRequest) -> HttpResponse:
    """The old address of the README page: the documentation's front page now."""
    return redirect("docs-page", permanent=True)
