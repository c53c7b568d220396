"""An IFRT proxy server: stock JAX programs (``jax_platforms='proxy'``) as Pathways clients.

``protocol`` reads the wire protocol out of the installed jaxlib; ``server`` serves
``xla.ifrt.proxy.GrpcIfrtService``; ``session`` runs one client's ordered requests; ``backend``
and ``local`` do the work. ``pathways proxy`` starts one; docs/proxy.md shows the client side.
"""
