"""The documentation pages inside the app: `docs/` (what `make docs` builds with MkDocs) rendered at
/docs/ for every signed-in user."""
