"""Pathways core: the pure domain shared by every component.

Resource models, accelerator catalogue, mesh topology, the global allocator, CRD generation and
manifest validation. No I/O, no threads, no cluster or accelerator libraries: everything here is a
synchronous function of its inputs, so every component (and every test) can use it directly.
"""
