"""Pathways operator: the global resource manager, as kopf handlers.

Run it with ``kopf run -m pathways_operator`` (never by file path).
"""
