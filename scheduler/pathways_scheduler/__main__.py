"""``python -m pathways_scheduler``: the gang scheduler of one island."""

from pathways_scheduler.server import main

main()
