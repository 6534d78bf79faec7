"""The workbench's ground: errors, environment, results with provenance, publishing, plots,
compile and timing helpers. The command line that drives them is cli/, on the top floor."""

class WorkbenchError(Exception):
    """An error meant for the user: printed as one line by the CLI, never as a traceback."""
