from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"

    def ready(self) -> None:
        # The project pages show the runs app's parts through the sections it registers, so the
        # projects app, below this one, never imports it (projects/sections.py); tier evaluations
        # find a run's policy versions through the resolver it registers (tiers/run_policies.py).
        from projects.sections import home_section_register, project_section_register
        from runs.sections import home_methods_section, project_runs_section
        from runs.tier_policies import run_policy
        from tiers.run_policies import run_policy_resolver_register

        project_section_register(project_runs_section)
        home_section_register(home_methods_section)
        run_policy_resolver_register(run_policy)
