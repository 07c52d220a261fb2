"""This process's data-parallel coordinate: what `StreamingDataset(rank=, world_size=)` takes under tensor and
pipeline parallelism.

Under tensor parallelism the ranks of one group compute one model replica on the same batch, and pipeline stages
pass one batch along; only the data-parallel dimensions read different data. So the loader's rank is the
data-parallel coordinate, and its world size the data-parallel size, not torch.distributed's rank and world:

    rank, world = data_parallel_coordinates(mesh)                       # from a DeviceMesh
    rank, world = data_parallel_coordinates(tensor_parallel=8, pipeline_parallel=4)   # from torchrun's env
    ds = StreamingDataset(path, seq_len=4096, rank=rank, world_size=world)

Ranks are taken as `init_device_mesh` lays them out for the dimensions (pp, dp..., tp), row-major: tensor
parallel innermost, pipeline outermost (torchtitan's and Megatron's order).
"""

from __future__ import annotations

import os
from typing import Any

from dataflow.errors import ConfigError

DATA_PARALLEL_DIMS = ("dp", "dp_replicate", "dp_shard", "replicate", "shard")  # mesh dimension names read as data


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, str(default))
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"environment variable {name} = {text!r} is not an integer (torchrun sets it)") from None


def _from_mesh(mesh: Any) -> tuple[int, int]:
    names = tuple(mesh.mesh_dim_names or ())
    if not names:
        raise ConfigError("data_parallel_coordinates: the DeviceMesh has no dimension names; name its data-parallel "
                          f"dimensions (one of {', '.join(DATA_PARALLEL_DIMS)}) with mesh_dim_names=")
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ConfigError("data_parallel_coordinates: this process is not in the DeviceMesh")
    rank, world = 0, 1
    for i, name in enumerate(names):
        if name in DATA_PARALLEL_DIMS:
            rank, world = rank * mesh.size(i) + coordinate[i], world * mesh.size(i)
    return rank, world


def data_parallel_coordinates(mesh: Any = None, *, tensor_parallel: int = 1,
                              pipeline_parallel: int = 1) -> tuple[int, int]:
    """(data-parallel rank, data-parallel size) of this process.

    From `mesh` (a `torch.distributed.device_mesh.DeviceMesh`): its dimensions named as data parallel
    (`dp`, `dp_replicate`, `dp_shard`, `replicate`, `shard`) flattened in order; the others (tp, pp, cp...) are
    ranks that read the same batch. Without a mesh: torchrun's RANK and WORLD_SIZE (0 and 1 in a plain process)
    split as (pp, dp, tp) by the given sizes. A world that the sizes do not divide is a ConfigError.
    """
    if mesh is not None:
        return _from_mesh(mesh)
    tp, pp = int(tensor_parallel), int(pipeline_parallel)
    if tp < 1 or pp < 1:
        raise ConfigError(f"data_parallel_coordinates: tensor_parallel = {tp} and pipeline_parallel = {pp} must be "
                          f"at least 1")
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    if world % (tp * pp):
        raise ConfigError(f"{world} processes (WORLD_SIZE) cannot split into tensor_parallel {tp} x pipeline_parallel "
                          f"{pp} x data parallel: start a multiple of {tp * pp}")
    dp = world // (tp * pp)
    return (rank // tp) % dp, dp
