"""`dataflow profile DATA ...`: argument parsing and dispatch for the starvation profiler.

`add_profile_parser(sub)` registers the subcommand on the `dataflow` parser. Nothing heavy is imported
until the command runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dataflow.errors import ConfigError


def add_profile_parser(sub: Any, formatter_class: type = argparse.HelpFormatter) -> argparse.ArgumentParser:
    """Add `profile` to the subparsers `sub` of the `dataflow` command (help laid out by `formatter_class`)."""
    p = sub.add_parser("profile", help="is training input-bound? loader capacity, data wait, stage breakdown",
                       description="Measure the loader alone (capacity), then against a consumer busy --step-ms "
                                   "per step (or the trainer's model with --config); report data wait, where "
                                   "the loader's time goes, and what to change.",
                       formatter_class=formatter_class)
    p.add_argument("data", nargs="?", help="dataset folder or URL (default with --config: its data.path)")
    p.add_argument("--batch-size", type=int, help="batch size (default with --config: data.batch_size)")
    p.add_argument("--seq-len", type=int, help="sequence length (default with --config: data.seq_len)")
    p.add_argument("--num-workers", type=int, help="loader workers (default: data.num_workers, else 2)")
    p.add_argument("--depth", type=int, help="DevicePrefetcher depth (default: data.prefetch_depth, else 2)")
    p.add_argument("--prefetch-factor", type=int, default=2, help="batches each worker keeps ready")
    consumer = p.add_mutually_exclusive_group()
    consumer.add_argument("--step-ms", type=float, help="the consumer sleeps this long per step (your step time)")
    consumer.add_argument("--config", help="trainer TOML: run the trainer's real model step as the consumer")
    p.add_argument("--batches", type=int, default=100, help="batches measured per phase")
    p.add_argument("--warmup", type=int, default=None, help="batches taken before measuring (default: enough "
                   "to start every worker)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] (default auto: cuda when present)")
    p.add_argument("--shuffle-window", type=int, default=None, help="shards shuffled together (default with "
                   "--config: data.shuffle_window, else the loader's own)")
    p.add_argument("--seed", type=int, default=None, help="shuffle seed (default: train.seed of --config, else 0)")
    p.add_argument("--sweep", nargs="+", metavar="KEY=V,V", help="also try each combination, e.g. "
                   "--sweep num_workers=0,1,2 depth=1,2,4; recommends the cheapest below 1%% data wait")
    p.add_argument("--fleet", metavar="RUN_DIR", help="instead: every rank's figures that StarvationMonitor("
                   "run_dir=RUN_DIR) wrote, in one view (wait share per rank and node, stragglers, the job's verdict); "
                   "--trace: a track per rank, --plot: a heat map of wait by rank and time")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace / Perfetto JSON of the run")
    p.add_argument("--plot", metavar="FILE.png", help="write a figure (needs matplotlib: dataflow-lm[plot])")
    p.set_defaults(func=cmd_profile)
    return p


def _settings(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """RunSettings, the consumer and the loader factory from the arguments (and the training config)."""
    from dataflow.profiling import consumers
    from dataflow.profiling.session import RunSettings, make_loader, resolve_device

    target = consumers.load_target(args.config) if args.config else None
    defaults = target.defaults if target is not None else {}
    data = args.data or defaults.get("data")
    if not data:
        raise ConfigError("name the dataset: dataflow profile DATA ... (or set data.path in --config)")
    pick = {"batch_size": args.batch_size, "seq_len": args.seq_len, "num_workers": args.num_workers,
            "depth": args.depth, "shuffle_window": args.shuffle_window}
    for key, value in pick.items():
        if value is None:
            pick[key] = defaults.get(key)
    pick["num_workers"] = 2 if pick["num_workers"] is None else pick["num_workers"]
    pick["depth"] = 2 if pick["depth"] is None else pick["depth"]
    for key in ("batch_size", "seq_len"):
        if pick[key] is None:
            raise ConfigError(f"--{key.replace('_', '-')} is required (or take it from a trainer --config)")
    device = args.device
    if device == "auto" and defaults.get("device"):
        device = defaults["device"]
    seed = args.seed if args.seed is not None else defaults.get("seed", 0)
    s = RunSettings(data=data, prefetch_factor=args.prefetch_factor, batches=args.batches, warmup=args.warmup,
                    device=device, seed=seed, **pick)
    s.check()
    from dataflow.loading.dataset import StreamingDataset

    ds = StreamingDataset(data, seq_len=s.seq_len)  # reads the manifest: a wrong path fails before measuring
    if len(ds) < s.batch_size:
        raise ConfigError(f"{data} has {ds.num_samples} samples of {s.seq_len + 1} tokens: fewer than one batch "
                          f"of {s.batch_size}; lower --batch-size or --seq-len")
    if target is None:
        return s, consumers.sleeper(args.step_ms), make_loader
    return s, target.make_consumer(ds.vocab_size, s.seq_len, resolve_device(s.device)), target.make_loader


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the profile the arguments describe; the report dict (with trace/plot paths when written)."""
    from dataflow.profiling import sweep as sweeping
    from dataflow.profiling.session import run_config

    grid = sweeping.parse_sweep(args.sweep) if args.sweep else None
    if args.plot:
        from dataflow.profiling.plot import _pyplot

        _pyplot()  # a missing matplotlib fails before minutes of measuring
    s, consumer, loader_factory = _settings(args)

    def say(msg: str) -> None:
        print(f"dataflow profile: {msg}", file=sys.stderr, flush=True)

    say(f"measuring capacity, then {args.batches} batches against {consumer.description}")
    report: dict[str, Any] = {"result": run_config(s, consumer, loader_factory=loader_factory)}
    if grid:
        report["sweep"] = sweeping.sweep(s, grid, consumer, progress=say, loader_factory=loader_factory)
    if args.trace:
        from dataflow.profiling.trace import build_trace, write_trace

        r = report["result"]
        report["trace"] = write_trace(args.trace, build_trace(r["_timeline"], r["_stage_events"], r["_upstream"],
                                                              meta={"settings": r["settings"]}))
    if args.plot:
        from dataflow.profiling.plot import plot_run

        report["plot"] = plot_run(report["result"], args.plot)
    return report


def cmd_profile(args: argparse.Namespace) -> int:
    from dataflow.profiling.report import format_report, to_json

    if args.fleet:
        import json

        from dataflow.profiling.fleet import fleet_report, format_fleet

        fleet = fleet_report(args.fleet)
        if args.trace:
            from dataflow.profiling.fleet_views import fleet_trace
            from dataflow.profiling.trace import write_trace

            fleet["trace"] = write_trace(args.trace, fleet_trace(args.fleet))
        if args.plot:
            from dataflow.profiling.fleet_views import fleet_plot

            fleet["plot"] = fleet_plot(args.fleet, args.plot)
        print(json.dumps(fleet, indent=1) if args.json else format_fleet(fleet))
        return 0
    if args.step_ms is None and args.config is None:
        raise ConfigError("dataflow profile: give --step-ms MS or --config TOML (the consumer), or --fleet RUN_DIR")
    report = run(args)
    print(to_json(report) if args.json else format_report(report))
    return 0
