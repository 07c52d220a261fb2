"""Process group, device mesh, and the one ordered function that turns a GPT into a trainable parallel model.

Order matters (as in torchtitan): tensor parallelism splits each block's attention and MLP (and the vocabulary)
over the mesh's `tp` dimension, activation checkpointing wraps each block, then compile each block, then DDP
replicates, or FSDP2 shards over the data-parallel dimensions (`dp_shard`; HSDP: `dp_replicate` x `dp_shard`).
A single process always runs the plain model.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch
import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

from dataflow.errors import ConfigError
from trainer.config import Config
from trainer.layout import MESH_DIMS, ParallelLayout


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")
    layout: ParallelLayout = ParallelLayout()
    mesh: "DeviceMesh | None" = None  # (pp, dp_replicate, dp_shard, tp) of a multi-process FSDP/HSDP run

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_choice: str, layout: ParallelLayout = ParallelLayout()) -> Dist:
    """Pick the device and, under torchrun (WORLD_SIZE > 1), join the process group (nccl on GPU, gloo on CPU).
    `layout` is the run's, as `trainer.layout.plan_layout` checked it for this world."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if device_choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device = \"cuda\" but no CUDA device is visible; use \"auto\" or \"cpu\"")
    use_cuda = device_choice == "cuda" or (device_choice == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if use_cuda else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30),
                                device_id=device if use_cuda else None)
    return Dist(rank, world, local_rank, local_world, device, layout)


def set_cpu_threads(d: Dist, num_workers: int) -> int:
    """On CPU, split the cores among local processes, leaving one to each loader worker and one to the
    prefetch thread; returns the old count.

    Oversubscribed OpenMP threads spin against the loader and can slow small models tenfold. An explicit
    OMP_NUM_THREADS (torchrun sets 1) is respected.
    """
    previous = torch.get_num_threads()
    if d.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        cores = (os.cpu_count() or 1) // max(d.local_world_size, 1)
        torch.set_num_threads(max(1, cores - num_workers - 1))
    return previous


def build_mesh(cfg: Config, d: Dist) -> "DeviceMesh | None":
    """The (pp, dp_replicate, dp_shard, tp) mesh of `d.layout` for a multi-process FSDP/HSDP run; None for one
    process or DDP (which runs on the default group). Every rank calls it (it creates the sub-groups)."""
    if d.world_size == 1 or cfg.train.parallel == "ddp":
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(d.device.type, d.layout.shape, mesh_dim_names=MESH_DIMS)


def tensor_parallel_group(d: Dist) -> "dist.ProcessGroup | None":
    """The process group of this rank's tensor-parallel ranks (None without tensor parallelism)."""
    return d.mesh["tp"].get_group() if d.mesh is not None and d.layout.tp > 1 else None


def apply_tensor_parallel(gpt: nn.Module, tp_mesh: "DeviceMesh") -> None:
    """Megatron's split over `tp_mesh`: qkv and fc by output rows (colwise; qkv's rows are grouped by head, so whole
    heads), attention's and the MLP's proj by input columns (rowwise, all-reduced), the tied embedding by
    vocabulary rows (an all-reduced lookup) and lm_head by the same rows (logits all-gathered). Norms stay
    replicated. Every parameter keeps its name and its full shape as a DTensor."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan: dict = {}
    if gpt.tok_emb is not None:  # a pipeline stage holds the embedding (first) or lm_head (last), or neither
        plan["tok_emb"] = RowwiseParallel(input_layouts=Replicate())
    if gpt.lm_head is not None:
        plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    for i in gpt.blocks:
        plan.update({f"blocks.{i}.attn.qkv": ColwiseParallel(), f"blocks.{i}.attn.proj": RowwiseParallel(),
                     f"blocks.{i}.mlp.fc": ColwiseParallel(), f"blocks.{i}.mlp.proj": RowwiseParallel()})
    parallelize_module(gpt, tp_mesh, plan)
    gpt.tie_weights()  # each module got its own DTensor of the shared matrix: both hold Shard(0), tie them again


def _data_parallel_mesh(cfg: Config, d: Dist) -> "DeviceMesh":
    """FSDP shards over dp_shard; HSDP replicates over dp_replicate and shards over dp_shard."""
    return d.mesh["dp_shard"] if cfg.train.parallel == "fsdp" else d.mesh["dp_replicate", "dp_shard"]


def parallelize(model: nn.Module, cfg: Config, d: Dist) -> nn.Module:
    """Tensor parallel -> activation checkpointing -> torch.compile -> DDP / FSDP2 / HSDP, in that order."""
    if d.layout.tp > 1:
        apply_tensor_parallel(model, d.mesh["tp"])
    blocks = model.blocks
    if cfg.train.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for i, block in blocks.items():
            blocks[i] = checkpoint_wrapper(block, preserve_rng_state=cfg.model.dropout > 0)
    if cfg.train.compile:
        for block in blocks.values():
            block.compile()
    if d.world_size == 1 or d.layout.dp == 1:  # one process, or tensor parallel only: nothing to replicate
        return model
    if cfg.train.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, device_ids=[d.local_rank] if d.device.type == "cuda" else None)
        _comm_hook(ddp, cfg, d)
        return ddp
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = _data_parallel_mesh(cfg, d)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if cfg.train.precision == "bf16" else MixedPrecisionPolicy()
    for i, block in enumerate(blocks.values()):
        # the last block's parameters are needed right away by backward: keep them gathered (and under pipeline
        # parallelism all of them: each micro-batch's forward and backward would gather them again)
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(blocks) - 1 and d.layout.pp == 1)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def _comm_hook(ddp: nn.Module, cfg: Config, d: Dist) -> None:
    """Optional DDP gradient compression: bf16 all-reduce (NCCL only) or PowerSGD low-rank."""
    hook = cfg.train.ddp_comm_hook
    if hook == "bf16":
        if d.device.type != "cuda":
            raise ConfigError("train.ddp_comm_hook = \"bf16\" needs CUDA and NCCL; on CPU use \"none\" or \"powersgd\"")
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        ddp.register_comm_hook(None, bf16_compress_hook)
    elif hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=cfg.train.powersgd_rank,
                                   start_powerSGD_iter=max(2, cfg.train.warmup_steps))
        ddp.register_comm_hook(state, psgd.powerSGD_hook)


def uses_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def grad_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce/reduce-scatter on non-final micro-steps of gradient accumulation."""
    if uses_fsdp(model):
        model.set_requires_gradient_sync(enabled)
        yield
    elif not enabled and hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    else:
        yield


def unwrap(model: nn.Module) -> nn.Module:
    """The GPT inside a DDP wrapper (FSDP2 modules are the GPT itself)."""
    return getattr(model, "module", model)


@dataclass
class Pipeline:
    """This rank's pipeline stage: the schedule that runs it, and the groups its step needs."""

    schedule: object  # torch.distributed.pipelining's Schedule1F1B (or GPipe when micro-batches < stages)
    first: bool
    last: bool
    pp_group: "dist.ProcessGroup"  # this rank's stages: the gradient norm sums over them
    tied_group: "dist.ProcessGroup | None"  # first and last stage of this coordinate: the tied matrix's gradient
    tied: "nn.Parameter | None"  # this stage's copy of the tied embedding/lm_head matrix


def stage_index(d: Dist) -> int:
    """This rank's pipeline stage (0 without pipeline parallelism): its coordinate on the mesh's pp dimension."""
    return d.mesh.get_local_rank("pp") if d.mesh is not None and d.layout.pp > 1 else 0


def _tied_group(d: Dist) -> "dist.ProcessGroup":
    """The (first stage, last stage) group of this rank's (dp, tp) coordinate; every rank creates every group."""
    if d.layout.pp == 2:
        return d.mesh["pp"].get_group()
    ranks, mine = d.mesh.mesh, None
    for coordinate in torch.cartesian_prod(*(torch.arange(n) for n in d.layout.shape[1:])).reshape(-1, 3).tolist():
        r, s, t = coordinate
        pair = [int(ranks[0, r, s, t]), int(ranks[-1, r, s, t])]
        group = dist.new_group(pair)
        mine = group if d.rank in pair else mine
    return mine


def build_pipeline(model: nn.Module, gpt: nn.Module, grad_accum: int, d: Dist) -> Pipeline:
    """The stage of `model` (a GPT cut by `keep_stage`, materialised) in a 1F1B schedule of `grad_accum`
    micro-batches (GPipe when there are fewer micro-batches than stages), the loss on the last stage."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from trainer.model import token_loss

    index, stages = stage_index(d), d.layout.pp
    stage = PipelineStage(model, index, stages, d.device, group=d.mesh["pp"].get_group())
    kind = Schedule1F1B if grad_accum >= stages else ScheduleGPipe
    first, last = index == 0, index == stages - 1
    tied = gpt.tok_emb.weight if first else gpt.lm_head.weight if last else None
    return Pipeline(kind(stage, n_microbatches=grad_accum, loss_fn=token_loss), first, last,
                    d.mesh["pp"].get_group(), _tied_group(d), tied)
