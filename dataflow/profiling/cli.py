"""Old name of `dataflow.profiling.subcommand`, kept only while `dataflow/cli.py` imports it from here.

Remove once `dataflow/cli.py` reads `from dataflow.profiling.subcommand import add_profile_parser`.
"""

from dataflow.profiling.subcommand import add_profile_parser

__all__ = ["add_profile_parser"]
