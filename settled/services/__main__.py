"""``python -m settled.services``: the ``settled`` command line."""

from settled.services.cli import main

main()
