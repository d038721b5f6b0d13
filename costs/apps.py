from django.apps import AppConfig


class CostsConfig(AppConfig):
    name = "costs"
    verbose_name = "What runs use and cost: usage units, prices and budgets"

    def ready(self) -> None:
        # A project past its monthly budget admits no new run: runs asks its registered request
        # checks at launch, so runs imports nothing of ours.
        # The run page's cost panel is ours too, drawn through the sections runs asks for.
        from costs.sections import project_cost_section, run_cost_section
        from costs.services import project_budget_problems
        from projects.sections import project_section_register
        from runs.lifecycle import REQUEST_CHECKS
        from runs.run_page import run_section_register

        if project_budget_problems not in REQUEST_CHECKS:
            REQUEST_CHECKS.append(project_budget_problems)
        run_section_register(run_cost_section)
        project_section_register(project_cost_section)
