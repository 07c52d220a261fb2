"""Profiling GPU starvation: `StarvationMonitor` inside any loop, `dataflow profile` from the command line.

monitor (the in-loop measurements), gpu (CUDA events, NVML), stages (stage figures from the loader
and prefetcher), recorder (per-batch stage timestamps inside workers), profile (capacity and consumer
runs), sweep (configurations and the recommendation), advice, report (table, JSON), trace (Chrome
trace), plot (matplotlib), consumers (sleep or the trainer's model step), overhead, cli.
"""
