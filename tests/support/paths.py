"""Where things are: the repository, the tests, their data (all inside the repository: a user's clone has nothing
beside it)."""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository
TESTS = ROOT / "tests"
DATA = TESTS / "data"
OLD_STATES = TESTS / "old_states"  # datasets and loader states written by earlier versions
