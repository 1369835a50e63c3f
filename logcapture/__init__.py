"""logcapture: capture, render and store the console output of batch-cluster jobs."""

__version__ = "0.1.0"
