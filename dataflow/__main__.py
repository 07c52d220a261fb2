"""`python -m dataflow` is the `dataflow` command."""

import sys

from dataflow.cli import main

sys.exit(main())
