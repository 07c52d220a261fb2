"""tokenize on the local pool and on Ray tasks, for tests that compare the two."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from dataflow.preprocess.run import TokenizeConfig, tokenize
from support.cli import dataset_bytes


def local_and_ray_shards(tmp_path: Path, before_ray: Callable[[], None], **settings: Any) -> list[dict[str, bytes]]:
    """The shards of a tokenize on the local pool, then (after `before_ray()`) of the same on Ray tasks, in an
    in-process cluster of 2 CPUs."""
    import ray

    tokenize(TokenizeConfig(out=str(tmp_path / "local"), **settings))
    before_ray()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        tokenize(TokenizeConfig(out=str(tmp_path / "ray"), executor="ray", **settings))
    finally:
        ray.shutdown()
    return [{k: v for k, v in dataset_bytes(tmp_path / out).items() if "shard-" in k} for out in ("local", "ray")]
