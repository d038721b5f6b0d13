from django.apps import AppConfig


class DocsPagesConfig(AppConfig):
    name = "docs_pages"
    verbose_name = "Documentation pages"
