"""Profiling GPU starvation: `StarvationMonitor` inside any loop, `dataflow profile` from the command line.

monitor (the in-loop measurements), gpu (CUDA events, NVML), breakdown (stage figures of the loader
and prefetcher, through the `StageFigures` contract), recorder (per-batch stage records from the
loader's `stage_hook`), session (one profiled configuration: capacity, then against a consumer),
sweep (configurations and the recommendation), advice, report (table, JSON), trace (Chrome trace),
plot (matplotlib), consumers (sleep or the trainer's model step), overhead, subcommand (the `dataflow
profile` subcommand's arguments and dispatch; `cli` is its old name, kept for `dataflow/cli.py`).
"""
