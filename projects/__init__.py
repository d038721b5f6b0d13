"""Projects and who may do what in them (members, roles, API tokens), and the task library: task
sets, their immutable versions and items, imports in every supported format, exports and splits."""
