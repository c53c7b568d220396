"""Pathways REST API: multi-tenant submission over HTTP."""
