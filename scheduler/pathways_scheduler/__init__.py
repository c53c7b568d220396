"""Pathways island scheduler: the per-island gang scheduler server."""
