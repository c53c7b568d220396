"""Pathways operator: the global resource manager, as kopf handlers.

Run it with ``kopf run -m pathways_operator --all-namespaces`` (never by file path); see the
README's operator section for peering (high availability), settings and metrics.

API calls the operator makes (its RBAC, as verbs per resource):

- ``pathways.dev`` ``islands``: get, list, watch, patch; ``islands/status``: get, patch
- ``pathways.dev`` ``virtualslices``: get, list, watch, create, patch, delete;
  ``virtualslices/status``: get, patch
- ``pathways.dev`` ``pathwaysprograms``: get, list, watch, patch;
  ``pathwaysprograms/status``: get, patch
- ``apps`` ``deployments``, ``statefulsets``: get, list, watch, create, patch, delete
- ``""`` (core) ``services``, ``configmaps``: get, create, patch, delete
- ``""`` (core) ``secrets``: create only, in the islands' namespace, with
  ``PATHWAYS_CONTROL_TOKENS`` (each island's control token; never read, patched or listed)
- ``""`` (core) ``pods``: list (which executor hosts are ready)
- ``batch`` ``jobs``: get, list, watch, create, patch (a run's deadline), delete
- ``""`` (core) ``events``: create, patch; ``events.k8s.io`` ``events``: create, patch (kopf)
- ``""`` (core) ``namespaces``: list, watch (kopf, only when run with ``--namespace`` patterns)
- ``apiextensions.k8s.io`` ``customresourcedefinitions``: list, watch (kopf's discovery)
- ``kopf.dev`` ``clusterkopfpeerings``: get, list, watch, patch (with ``--peering``; kopf's
  peering CRDs must be installed)

The chart's uninstall hook (:mod:`pathways_operator.uninstall`, its own service account):
``pathways.dev`` ``islands``: list, delete.

``patch`` on the watched resources covers kopf's finalizer (``pathways.dev/finalizer``) and its
progress annotations (``pathways.dev/*``). Everything else is cluster-wide: islands are
cluster-scoped, and slices and programs live in tenants' namespaces.
"""

from pathways_operator import handlers as handlers
