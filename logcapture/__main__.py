"""``python -m logcapture`` runs the CLI."""

from .cli import main

main()
