from django.apps import AppConfig


class RewardsConfig(AppConfig):
    name = "rewards"

    def ready(self) -> None:
        # Registered here so that the projects app, which rewards builds on, never imports rewards:
        # the task library's `verify` runs graders (projects/stub_checks.py), and a project's page
        # lists its reward rules (projects/sections.py).
        from projects.sections import project_section_register
        from projects.stub_checks import version_verifier_register
        from rewards.selectors import reward_rules_of
        from rewards.stub_checks import version_verify

        version_verifier_register(version_verify)
        project_section_register(lambda request, project: {"reward_rules": reward_rules_of(project=project)})
