"""Pathways client: the Python SDK and the ``pathways`` command-line interface."""
