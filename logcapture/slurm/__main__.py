"""``python -m logcapture.slurm prolog|epilog``: the hooks without the CLI."""

import sys

from .hooks import _hook_main

if len(sys.argv) == 2 and sys.argv[1] in ("prolog", "epilog"):
    sys.exit(_hook_main(sys.argv[1]))
sys.stderr.write("usage: python -m logcapture.slurm prolog|epilog\n")
sys.exit(2)
