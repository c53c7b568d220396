"""Pathways executor: the per-host server that owns devices and runs compiled functions."""
