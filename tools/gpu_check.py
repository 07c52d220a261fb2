"""One self-contained check for a CUDA machine (under 5 minutes): prints what the CPU tests cannot show.

1. pinned vs pageable host-to-device bandwidth;
2. proof of overlap: a copy timed alone, a matmul alone, both together on two streams;
3. the prefetcher's wait per batch against a model step (loader workers -> pinned ring -> GPU);
4. the trainer's tokens/s and data-wait % for a short GPU run;
5. tensor parallelism through the trainer's own code path at tp 1 (a 1-rank mesh, DTensor weights, FSDP2 over the
   data dimension): the same losses and gradient norms as the plain model, and its step time beside the plain one.

    python tools/gpu_check.py [--out gpu-check-out]
    python tools/gpu_check.py --dry-run     # no GPU: parts 3, 4 and 5 on the CPU, tiny, to test this script
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the trainer's own modules (part 5), from a clone


def bandwidth(nbytes: int = 256 << 20, reps: int = 10) -> None:
    dev = torch.device("cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    for name, src in (("pageable", torch.empty(nbytes, dtype=torch.uint8)),
                      ("pinned", torch.empty(nbytes, dtype=torch.uint8, pin_memory=True))):
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        gbs = nbytes * reps / (start.elapsed_time(end) / 1e3) / 1e9
        print(f"  host-to-device {name:<9} {gbs:6.1f} GB/s")


def overlap() -> None:
    dev = torch.device("cuda")
    host = torch.empty(512 << 20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty_like(host, device=dev)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    side = torch.cuda.Stream()

    def copy() -> None:
        with torch.cuda.stream(side):
            dst.copy_(host, non_blocking=True)

    def matmul() -> None:
        for _ in range(8):
            a @ a

    def timed(fn) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    timed(copy), timed(matmul)
    c, m = timed(copy), timed(matmul)
    both = timed(lambda: (copy(), matmul()))
    print(f"  copy alone {c * 1e3:.1f} ms, matmul alone {m * 1e3:.1f} ms, both together {both * 1e3:.1f} ms "
          f"(sum {1e3 * (c + m):.1f} ms): {'OVERLAP' if both < 0.85 * (c + m) else 'no overlap'}")


def make_dataset(path: str, tokens: int) -> str:
    from dataflow import ShardWriter, TokenizerMeta

    if os.path.exists(os.path.join(path, "index.json")):
        return path
    meta = TokenizerMeta(kind="hf", name="random-gpt2-vocab", vocab_size=50257, eos_id=50256)
    rng = np.random.default_rng(0)
    with ShardWriter(path, tokenizer_meta=meta, shard_size="32MB") as w:
        for _ in range(tokens // 4000):
            w.write(rng.integers(0, 50256, 4000, dtype=np.uint16))
    return path


def prefetch_vs_step(data: str, device: str, steps: int) -> None:
    from dataflow import DevicePrefetcher, StarvationMonitor, StreamingDataLoader, StreamingDataset

    cuda = device == "cuda"
    n = 2048 if cuda else 128  # the "model": a chain of n x n matmuls on each batch
    w = torch.randn(n, n, device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    for workers in (0, 2):
        loader = StreamingDataLoader(StreamingDataset(data, seq_len=2048), batch_size=8, num_workers=workers,
                                     pin_memory=cuda)
        pf = DevicePrefetcher(loader, device=device, depth=2)
        mon = StarvationMonitor()
        for i, batch in enumerate(mon.wrap(pf)):
            with mon.step():
                x = batch["input_ids"][:, :n].to(w.dtype) @ w
                for _ in range(6):
                    x = x @ w
                if cuda:
                    torch.cuda.synchronize()
            if i == steps:
                break
        s = mon.summary()
        print(f"  loader workers={workers}: wait {1e3 * s['data_wait_s'] / max(s['steps'], 1):.3f} ms/batch vs step "
              f"{1e3 * s['step_s']:.2f} ms; data wait {s['data_wait_pct']:.2f}%; staging copies avoided "
              f"{pf.stats.direct_copies}/{pf.stats.batches}; H2D copy {1e3 * pf.stats.copy_s / max(pf.stats.batches, 1):.3f} ms/batch")
        loader.close()


def trainer_run(data: str, out: str, dry_run: bool) -> None:
    """GPT-2 small (bf16, compiled, 4 loader workers) for 40 steps of 131K tokens; tiny on the CPU."""
    sets = [f"data.path={data}", "train.steps=40", "train.grad_accum=4", "train.warmup_steps=10",
            "train.eval_every=0", "log.every=10", f"checkpoint.dir={out}/ckpt", "checkpoint.resume=none",
            f"log.jsonl={out}/metrics.jsonl"]
    if dry_run:
        sets += ["train.steps=4", "train.grad_accum=1", "train.device=cpu", "train.precision=fp32",
                 "train.compile=false", "model.n_layer=2", "model.n_head=2", "model.d_model=64",
                 "data.seq_len=128", "data.batch_size=4", "data.num_workers=1", "log.every=2"]
    cmd = [sys.executable, "-m", "trainer", "--config", os.path.join(ROOT, "configs", "gpt2-124m.toml")]
    for item in sets:
        cmd += ["--set", item]
    print("  $ " + " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=240)
    except subprocess.TimeoutExpired as e:
        print(f"  trainer did not finish in {e.timeout:.0f} s; its last output:")
        p = subprocess.CompletedProcess(cmd, -1, (e.stdout or b"").decode(errors="replace"),
                                        (e.stderr or b"").decode(errors="replace"))
    print("\n".join("  " + line for line in (p.stdout + p.stderr).strip().splitlines()[-12:]))
    if p.returncode:
        raise SystemExit(f"trainer exited with {p.returncode}")
    # the trainer must run the product's path: the loader itself behind the prefetcher, pinned on CUDA
    path = next((line for line in p.stdout.splitlines() if "data path: StreamingDataLoader(" in line), "")
    m = re.search(r"pinned=(\w+)\) -> DevicePrefetcher\((\w+).*?(\d+)/(\d+) batches", path)
    if not m:
        raise SystemExit("the trainer did not report its data path")
    pinned, device, direct, batches = m.group(1) == "True", m.group(2), int(m.group(3)), int(m.group(4))
    if not dry_run and not (pinned and device == "cuda" and direct == batches > 0):
        raise SystemExit(f"the trainer did not copy straight from pinned loader memory: {path.strip()}")
    print(f"  data path checked: {'pinned direct copies' if pinned else 'CPU, no copies'}, {batches} batches")


def _tp_models(device: str, dry_run: bool) -> tuple:
    """The config, the plain GPT and the same GPT through the trainer's tensor-parallel path at tp 1."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from trainer.config import load_config
    from trainer.layout import MESH_DIMS
    from trainer.model import GPT
    from trainer.parallelize import apply_tensor_parallel

    small = ["model.n_layer=2", "model.n_head=2", "model.d_model=64", "data.seq_len=128"] if dry_run else \
        ["model.n_layer=12", "model.n_head=12", "model.d_model=768", "data.seq_len=1024"]
    cfg = load_config(None, ["data.path=unused", "train.precision=fp32", *small])
    if not dist.is_initialized():  # one rank of its own: the mesh and DTensors need a process group
        import tempfile

        store = os.path.join(tempfile.mkdtemp(prefix="gpu-check-"), "store")
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{store}", rank=0,
                                world_size=1)
    mesh = init_device_mesh(device, (1, 1, 1, 1), mesh_dim_names=MESH_DIMS)
    vocab = 512 if dry_run else 50257
    plain = GPT(cfg.model, vocab, cfg.data.seq_len).to(device)
    plain.init_weights(0)
    with torch.device("meta"):
        tp = GPT(cfg.model, vocab, cfg.data.seq_len)
    apply_tensor_parallel(tp, mesh["tp"])
    for block in tp.blocks.values():
        fully_shard(block, mesh=mesh["dp_shard"])
    fully_shard(tp, mesh=mesh["dp_shard"])
    tp.to_empty(device=device)
    tp.tie_weights()
    tp.init_weights(0)
    return cfg, plain, tp


def tensor_parallel_step(device: str, dry_run: bool, steps: int) -> None:
    """The trainer's tensor-parallel path at tp 1 against the plain model: losses and grad norms step for step."""
    from trainer.step import clip_grads

    cfg, plain, tp = _tp_models(device, dry_run)
    same = all(torch.equal(p.full_tensor() if hasattr(p, "full_tensor") else p, q)
               for p, q in zip(tp.parameters(), plain.parameters()))
    gen = torch.Generator().manual_seed(0)
    worst, times = 0.0, {"plain": 0.0, "tp": 0.0}
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-3) for name, m in (("plain", plain), ("tp", tp))}
    for _ in range(steps):
        ids = torch.randint(0, plain.vocab_size, (4, cfg.data.seq_len + 1), generator=gen).to(device)
        out = {}
        for name, model in (("plain", plain), ("tp", tp)):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = model(ids[:, :-1], ids[:, 1:])
            loss.backward()
            norm = clip_grads(model, 1.0)
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)
            out[name] = (loss.item(), float(norm))
            times[name] += time.perf_counter() - t0
        worst = max(worst, abs(out["tp"][0] - out["plain"][0]) / abs(out["plain"][0]),
                    abs(out["tp"][1] - out["plain"][1]) / abs(out["plain"][1]))
    print(f"  tp 1 weights {'equal' if same else 'DIFFER from'} the plain model's; worst relative difference of "
          f"loss / grad norm over {steps} steps {worst:.2e}; step {1e3 * times['tp'] / steps:.1f} ms (plain "
          f"{1e3 * times['plain'] / steps:.1f} ms)")
    if not same or worst > 1e-4:
        raise SystemExit("the tensor-parallel path at tp 1 does not train as the plain model")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(ROOT, "gpu-check-out"))
    p.add_argument("--dry-run", action="store_true", help="no GPU needed: parts 3, 4 and 5, tiny, on the CPU")
    args = p.parse_args()
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        print("no CUDA device: nothing to check here (--dry-run tests this script on the CPU)")
        return 1
    print(f"dry run on the CPU, torch {torch.__version__}" if dry else
          f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    if not dry:
        print("1. bandwidth", flush=True)
        bandwidth()
        print("2. overlap", flush=True)
        overlap()
    data = make_dataset(os.path.join(args.out, "data-dry" if dry else "data"), 400_000 if dry else 40_000_000)
    print("3. prefetcher wait per batch vs a model step", flush=True)
    prefetch_vs_step(data, "cpu" if dry else "cuda", steps=10 if dry else 300)
    print("4. trainer, short run", flush=True)
    trainer_run(data, args.out, dry_run=dry)
    print("5. tensor parallel path at tp 1 vs the plain model", flush=True)
    tensor_parallel_step("cpu" if dry else "cuda", dry, steps=4 if dry else 20)
    return 0

if __name__ == "__main__":
    sys.exit(main())
