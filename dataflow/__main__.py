"""`python -m dataflow` is the `dataflow` command."""

from dataflow.cli import run

run()
