"""``python -m logcapture`` runs the CLI (``run`` without click: ``entry``)."""

from .entry import main

main()
