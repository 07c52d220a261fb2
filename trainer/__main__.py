"""`python -m trainer --config NAME|FILE.toml [--set section.key=value ...]` (also `dataflow train`, and
under torchrun).

Exit codes: 0 done, 1 failed (one line says why), 2 configuration or usage error.
"""

from __future__ import annotations

import argparse
import os
import sys

from dataflow.errors import ConfigError, DataflowError


def main(argv: list[str] | None = None, prog: str = "python -m trainer") -> int:
    from trainer.config import builtin_configs

    p = argparse.ArgumentParser(prog=prog, description="Train a GPT from a dataflow dataset.")
    p.add_argument("--config", required=True,
                   help=f"a TOML config file, or the name of a built-in one ({', '.join(builtin_configs())}); "
                        f"relative paths in your own file are read against its folder, in a built-in one "
                        f"against the working directory")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one key; the value is read as a TOML literal, else as a plain string")
    args = p.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    prefix = f"trainer: error (rank {rank}): " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "trainer: error: "
    from trainer.config import load_config

    try:
        cfg = load_config(args.config, args.set)
        from trainer.loop import train

        train(cfg)
    except ConfigError as e:
        if rank == 0:  # every rank reads the same config: one line is enough
            print(prefix + str(e), file=sys.stderr)
        return 2
    except DataflowError as e:
        print(prefix + str(e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
