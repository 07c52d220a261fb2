"""`dataflow audit DIR [--json]`: argument parsing and dispatch for the data-order audit.

Exit 0: every sample of each epoch served once; 1: findings (each named); 2: a usage error (one line).
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable


def add_audit_parser(add: Callable[[str, str], argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register `audit` through `add(name, help)` (the `dataflow` parser's subcommand maker)."""
    a = add("audit", "check a run's data order: every sample of each epoch served once across ranks and resumes")
    a.add_argument("folder", metavar="DIR", help="the folder given to the loaders as audit= (audit-rank-R.jsonl files)")
    a.add_argument("--json", action="store_true", help="print the report as JSON")
    a.set_defaults(func=cmd_audit)
    return a


def cmd_audit(args: Any) -> int:
    from dataflow.audit.replay import audit_folder
    from dataflow.audit.text import format_report

    report = audit_folder(args.folder)
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0 if report["clean"] else 1
