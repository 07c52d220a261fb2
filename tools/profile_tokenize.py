"""Where `dataflow tokenize` spends its time: cProfile of the main process and of one worker.

The main process is profiled in a real run with `--workers N` (its own time: loading and proving the
tokenizer, committing units, writing shards; the workers' time is not in it). A worker is profiled by running
the same units through the worker's function (`tokenize_bundle`) in this process, as a pool worker does.
The corpus is the one tools/bench_tokenize.py writes (run it first, or pass --work).

    python tools/profile_tokenize.py --work bench-out/tokenize-100M-distinct --workers 2
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import io
import os
import pstats
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools import repo_data  # noqa: E402


def show(profile: cProfile.Profile, title: str, lines: int) -> None:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    print(f"\n== {title}: {stats.total_tt:.2f} s ==")
    stats.sort_stats("tottime").print_stats(lines)
    print("\n".join(out.getvalue().splitlines()[4:]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=os.path.join(ROOT, "bench-out", "tokenize-100M-distinct"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--lines", type=int, default=18)
    args = p.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    from dataflow.preprocess.plan import plan_units
    from dataflow.preprocess.run import TokenizeConfig, tokenize
    from dataflow.tokenizers.load import load_tokenizer
    from dataflow.preprocess.worker import UnitSpec, adopt_tokenizer, tokenize_bundle

    files = sorted(glob.glob(os.path.join(args.work, "input", "*.jsonl")))
    if not files:
        raise SystemExit(f"no corpus in {args.work}/input: run tools/bench_tokenize.py first")
    gpt2 = str(repo_data.gpt2_json())
    with tempfile.TemporaryDirectory() as tmp:
        main_profile = cProfile.Profile()
        cfg = TokenizeConfig(inputs=files, out=os.path.join(tmp, "out"), tokenizer=gpt2, workers=args.workers,
                             progress=False)
        main_profile.runcall(tokenize, cfg)
        show(main_profile, f"main process, --workers {args.workers}", args.lines)

        tok = load_tokenizer(gpt2, sample=[])
        spec = UnitSpec(gpt2, "auto", "text", "id", tok.meta.eos_id, tok.meta)
        adopt_tokenizer(spec.tokenizer, spec.engine, tok)
        units = plan_units(files)
        scratch = os.path.join(tmp, "units")
        os.makedirs(scratch)
        worker_profile = cProfile.Profile()
        worker_profile.enable()
        for i, unit in enumerate(units[::max(args.workers, 1)]):  # a worker's share of the units
            os.makedirs(os.path.join(scratch, str(i)))
            tokenize_bundle([unit], spec, os.path.join(scratch, str(i)))
        worker_profile.disable()
        shutil.rmtree(scratch)
        show(worker_profile, f"one worker (1/{max(args.workers, 1)} of the units)", args.lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
