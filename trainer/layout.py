"""The parallel layout of a run: (pp, dp_replicate, dp_shard, tp) and the accumulation that gives its global batch.

Decided from the config and torchrun's world before any process group exists, so an impossible layout is one
line (a `ConfigError`, exit 2) on every rank instead of a hang or a shape error deep in a collective. Ranks are
laid out as `init_device_mesh` lays out the mesh (pp, dp_replicate, dp_shard, tp), row-major: tensor-parallel
ranks are neighbours (one node's fast links), pipeline stages the outermost.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

from dataflow.errors import ConfigError
from trainer.config import Config, ModelConfig

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True)
class ParallelLayout:
    """How a run's processes split the model and the data."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    grad_accum: int = 1  # micro-batches per optimizer step (from train.global_batch_tokens when it is set)

    @property
    def dp(self) -> int:
        """Data-parallel size: the ranks that read different batches."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.pp, self.dp_replicate, self.dp_shard, self.tp

    def record(self) -> dict[str, int]:
        """The `log.jsonl` layout record's figures (and a checkpoint's)."""
        return {k: v for k, v in asdict(self).items() if k in MESH_DIMS}

    def describe(self) -> str:
        return f"pp {self.pp} x dp {self.dp} (replicate {self.dp_replicate}, shard {self.dp_shard}) x tp {self.tp}"


def torchrun_world() -> tuple[int, int]:
    """(WORLD_SIZE, LOCAL_WORLD_SIZE) as torchrun sets them; (1, 1) for a plain process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return world, int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))


def _divisors(n: int) -> str:
    return ", ".join(str(k) for k in range(1, n + 1) if n % k == 0)


def _check_model_split(m: ModelConfig, tp: int, pp: int) -> None:
    if m.n_head % tp:
        raise ConfigError(f"train.tensor_parallel = {tp} does not divide model.n_head = {m.n_head} (each rank holds "
                          f"whole heads); use one of {_divisors(m.n_head)}")
    hidden = int(m.mlp_ratio * m.d_model)
    if hidden % tp:
        raise ConfigError(f"train.tensor_parallel = {tp} does not divide the MLP's {hidden} hidden units "
                          f"(model.mlp_ratio x model.d_model); use one of {_divisors(hidden)}")
    if m.n_layer % pp:
        raise ConfigError(f"train.pipeline_parallel = {pp} does not divide model.n_layer = {m.n_layer} (stages hold "
                          f"equal numbers of layers); use one of {_divisors(m.n_layer)}")


def _data_parallel_split(cfg: Config, dp: int, local_world: int) -> tuple[int, int]:
    """(dp_replicate, dp_shard) of `dp` data-parallel ranks: DDP replicates, FSDP shards, HSDP both."""
    t = cfg.train
    if t.parallel == "ddp":
        return dp, 1
    if t.parallel == "fsdp":
        return 1, dp
    # hsdp: shard within a node (what is left of it after tp and pp), replicate across nodes
    replicas = t.hsdp_replicas or max(dp // max(local_world // (t.tensor_parallel * t.pipeline_parallel), 1), 1)
    if dp % replicas:
        raise ConfigError(f"train.hsdp_replicas = {replicas} does not divide the {dp} data-parallel ranks "
                          f"({dp * t.tensor_parallel * t.pipeline_parallel} processes / tp {t.tensor_parallel} / "
                          f"pp {t.pipeline_parallel}); use one of {_divisors(dp)}")
    return replicas, dp // replicas


def accumulation(cfg: Config, dp: int) -> int:
    """Micro-batches per optimizer step: train.grad_accum, or what train.global_batch_tokens asks of `dp` ranks."""
    d, gbt = cfg.data, cfg.train.global_batch_tokens
    if not gbt:
        return cfg.train.grad_accum
    per_micro = d.batch_size * dp
    if gbt % d.seq_len:
        raise ConfigError(f"train.global_batch_tokens = {gbt:,} is not a whole number of samples of data.seq_len "
                          f"= {d.seq_len} tokens; use a multiple of {d.seq_len}")
    samples = gbt // d.seq_len
    if samples % per_micro:
        fits = [b for b in range(1, samples // dp + 1) if samples % dp == 0 and (samples // dp) % b == 0]
        hint = (f"data.batch_size = {max(b for b in fits if b <= d.batch_size)} would" if fits
                else f"{samples:,} samples cannot split over {dp} data-parallel ranks: no data.batch_size can")
        raise ConfigError(f"train.global_batch_tokens = {gbt:,} ({samples:,} samples) is not a whole number of "
                          f"micro-batches of data.batch_size {d.batch_size} x {dp} data-parallel rank(s); {hint} "
                          f"give it exactly")
    return samples // per_micro


def plan_layout(cfg: Config, world_size: int, local_world_size: int | None = None) -> ParallelLayout:
    """The layout of `world_size` processes as `cfg` asks for it; a ConfigError (one line) when it cannot be."""
    t = cfg.train
    tp, pp = t.tensor_parallel, t.pipeline_parallel
    if t.parallel == "ddp" and (tp > 1 or pp > 1):
        raise ConfigError(f"train.tensor_parallel = {tp} and train.pipeline_parallel = {pp} need train.parallel = "
                          f"\"fsdp\" or \"hsdp\" (DDP keeps a whole model on each rank)")
    _check_model_split(cfg.model, tp, pp)
    if world_size % (tp * pp):
        raise ConfigError(f"{world_size} process(es) cannot be laid out as tp {tp} x pp {pp} x data parallel: start a "
                          f"multiple of {tp * pp} (torchrun --nproc-per-node), or change train.tensor_parallel / "
                          f"train.pipeline_parallel")
    if pp > 1 and cfg.data.doc_mask:
        raise ConfigError(f"data.doc_mask = true with train.pipeline_parallel = {pp}: the stages pass hidden states "
                          f"only, not the documents' positions; set data.doc_mask = false or pipeline_parallel = 1")
    dp = world_size // (tp * pp)
    replicate, shard = (1, 1) if world_size == 1 else _data_parallel_split(cfg, dp, local_world_size or world_size)
    return ParallelLayout(pp, replicate, shard, tp, accumulation(cfg, dp))


def check_vocab(layout: ParallelLayout, m: ModelConfig, vocab_size: int) -> None:
    """The embedding is split by vocabulary rows over tp: the padded vocabulary must divide."""
    padded = -(-vocab_size // m.vocab_multiple) * m.vocab_multiple  # as trainer.model.padded_vocab
    if padded % layout.tp:
        good = m.vocab_multiple * layout.tp // math.gcd(m.vocab_multiple, layout.tp)
        raise ConfigError(f"train.tensor_parallel = {layout.tp} does not divide the padded vocabulary of {padded} "
                          f"rows ({vocab_size} tokens padded to model.vocab_multiple = {m.vocab_multiple}); set "
                          f"model.vocab_multiple = {good}")
