"""Workbench infrastructure: CLI, environment, results with provenance, compile and timing helpers."""

class WorkbenchError(Exception):
    """An error meant for the user: printed as one line by the CLI, never as a traceback."""
