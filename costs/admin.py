from django.contrib import admin

from costs.models import Price, ProjectBudget, Usage


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    list_display = ("unit", "scope", "amount", "effective_from")
    list_filter = ("unit",)


@admin.register(ProjectBudget)
class ProjectBudgetAdmin(admin.ModelAdmin):
    list_display = ("project", "monthly", "updated_at")


@admin.register(Usage)
class UsageAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "component", "kind", "device_class", "device_seconds", "recordings")
    list_filter = ("kind",)
    readonly_fields = [field.name for field in Usage._meta.fields]
