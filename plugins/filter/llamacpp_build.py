"""Filter plugin: llamafleet.mtp.llamacpp_build_assignments (thin wrapper over module_utils)."""

from __future__ import annotations

# Documentation: llamacpp_build_assignments.yml beside this file (one filter, docs by its name).
from ansible_collections.llamafleet.mtp.plugins.module_utils.llamacpp_build import assign_builds


def llamacpp_build_assignments(plans, cached_keys=None, builders=None):
    return assign_builds(dict(plans), cached_keys or [], builders or [])


class FilterModule:
    def filters(self):
        return {"llamacpp_build_assignments": llamacpp_build_assignments}
