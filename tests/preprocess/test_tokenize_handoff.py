"""How work reaches tokenize's workers without costing a copy per worker: forked workers inherit the
tokenizer the coordinator loaded and proved (none loads it again), and a compressed input's pieces arrive
as spill files that the worker maps and deletes, never as bytes pickled through the pool's pipe."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
import zstandard

from support.data import GPT2_JSON
from dataflow.tokenizers import hf_reference, load as tokenizers
from dataflow.preprocess.plan import Unit, plan_units
from dataflow.sources import expand, read_unit_blocks
from dataflow.preprocess.run import TokenizeConfig, tokenize
from dataflow.preprocess.worker import UnitSpec, tokenize_bundle
from dataflow.tokenizers.load import load_tokenizer
from support.cli import dataset_bytes
from support.executors import local_and_ray_shards


def _lines(n: int = 3000) -> bytes:
    return "".join(json.dumps({"id": f"d{i}", "text": f"document {i} " + "word " * (i % 97)}) + "\n"
                   for i in range(n)).encode()


@pytest.fixture
def zst(tmp_path: Path) -> tuple[Path, bytes]:
    data = _lines()
    path = tmp_path / "in.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(data))
    return path, data


def test_forked_workers_inherit_the_loaded_tokenizer(tmp_path, zst, monkeypatch):
    """One load of tokenizer.json in the whole run, by this process: the two workers load nothing."""
    loads = tmp_path / "loads"
    original = tokenizers.HFTokenizer.__init__

    def logged(self, *args, **kwargs):
        with open(loads, "a") as f:  # forked workers inherit this patch: a load there is logged too
            f.write(f"{os.getpid()}\n")
        original(self, *args, **kwargs)

    monkeypatch.setattr(tokenizers.HFTokenizer, "__init__", logged)
    summary = tokenize(TokenizeConfig(inputs=[str(zst[0])], out=str(tmp_path / "out"), tokenizer=str(GPT2_JSON),
                                      workers=2, unit_bytes=64 << 10, progress=False))
    assert summary.documents == 3000 and summary.engine in ("gigatoken", "tiktoken", "hf")
    assert loads.read_text().split() == [str(os.getpid())]


def test_forked_workers_neither_load_tokenizers_nor_check_the_engine_again(tmp_path, zst, monkeypatch):
    """With the proof and metadata remembered, `tokenizers` itself loads once, in this process, for the input
    check (once the workers have started); the workers run the engine it checks and compare nothing."""
    load_tokenizer(str(GPT2_JSON))  # this machine remembers the proof and the metadata
    log = tmp_path / "log"

    def logged(what: str, real: Callable) -> Callable:
        def call(*args: Any) -> Any:
            with open(log, "a") as f:  # inherited by forked workers
                f.write(f"{what} {os.getpid()}\n")
            return real(*args)
        return call

    monkeypatch.setattr(hf_reference, "load_reference", logged("load", hf_reference.load_reference))
    monkeypatch.setattr(tokenizers.HFTokenizer, "_check_sample", logged("check", tokenizers.HFTokenizer._check_sample))
    summary = tokenize(TokenizeConfig(inputs=[str(zst[0])], out=str(tmp_path / "out"), tokenizer=str(GPT2_JSON),
                                      workers=2, unit_bytes=64 << 10, progress=False))
    assert summary.documents == 3000 and summary.engine == "gigatoken"
    assert log.read_text().splitlines() == [f"load {os.getpid()}"]


def test_wrong_remembered_metadata_restarts_the_workers_and_the_bytes_are_right(tmp_path, zst, monkeypatch):
    settings = dict(tokenizer=str(GPT2_JSON), workers=2, unit_bytes=64 << 10, progress=False)
    tokenize(TokenizeConfig(inputs=[str(zst[0])], out=str(tmp_path / "ref"), **settings))
    [record] = Path(os.environ["DATAFLOW_PROOF_CACHE"]).glob(f"{load_tokenizer(str(GPT2_JSON)).meta.sha256}-*.meta.json")
    record.write_text(json.dumps({"vocab_size": 70000, "eos_id": 7}))  # uint32 tokens, another EOS: both wrong
    submits = []
    monkeypatch.setattr(tokenizers.HFTokenizer, "share_check_with_forks", lambda self: submits.append(self.meta.eos_id))
    tokenize(TokenizeConfig(inputs=[str(zst[0])], out=str(tmp_path / "out"), **settings))
    assert submits == [7, 50256] and json.loads(record.read_text())["eos_id"] == 50256
    assert dataset_bytes(tmp_path / "out") == dataset_bytes(tmp_path / "ref")


def test_pieces_travel_as_spill_files_that_the_worker_deletes(tmp_path, zst):
    path, data = zst
    spill = tmp_path / "spill"
    spill.mkdir()
    units = plan_units([str(path)], 64 << 10)
    pieces = [bundle[0] for bundle in expand([units], 16 << 10, spill_dir=str(spill))]
    assert len(pieces) > 4 and all(p.data is None and p.spill for p in pieces)
    assert b"".join(Path(p.spill).read_bytes() for p in pieces) == data
    inline = [bundle[0] for bundle in expand([units], 16 << 10)]
    assert all(p.data is not None and not p.spill for p in inline)
    for mapped, carried in zip(pieces, inline):  # the same records, read in place or from the unit's bytes
        a, b = list(read_unit_blocks(mapped)), list(read_unit_blocks(carried))
        assert [x.texts.to_pylist() for x in a] == [x.texts.to_pylist() for x in b]
        assert [x.starts.tolist() for x in a] == [x.starts.tolist() for x in b]
    spec = UnitSpec("bytes", "auto", "text", "id", 256, load_tokenizer("bytes").meta)
    [result] = tokenize_bundle([pieces[0]], spec, str(tmp_path / "scratch"))
    assert result.documents > 0 and not os.path.exists(pieces[0].spill)


def test_a_failing_piece_still_deletes_its_spill_file(tmp_path):
    spill = tmp_path / "piece.jsonl"
    spill.write_bytes(b'{"text": "fine"}\n')
    unit = Unit(0, str(tmp_path / "in.jsonl.zst"), "jsonl", piece=0, spill=str(spill), size=17)
    spec = UnitSpec("no-such-tokenizer.json", "hf", "text", "id", 0, load_tokenizer("bytes").meta)
    with pytest.raises(Exception):
        tokenize_bundle([unit], spec, str(tmp_path / "scratch"))
    assert not spill.exists()


def test_spilled_and_carried_pieces_give_the_same_dataset(tmp_path, zst):
    """In process, pieces are spilled; the same bytes as shards made from an uncompressed copy of the file."""
    plain = tmp_path / "in.jsonl"
    plain.write_bytes(zst[1])
    for src, out in ((zst[0], "zst"), (plain, "plain")):
        tokenize(TokenizeConfig(inputs=[str(src)], out=str(tmp_path / out), unit_bytes=64 << 10, workers=2,
                                shard_size="64KB", progress=False))
    shards = [{k: v for k, v in dataset_bytes(tmp_path / out).items() if "shard-" in k} for out in ("zst", "plain")]
    assert shards[0] == shards[1] and len(shards[0]) > 2
    assert not any((tmp_path / "zst").rglob("piece-*"))


@pytest.mark.heavy  # a Ray cluster in-process (make test-all)
def test_ray_tasks_get_the_pieces_with_their_bytes_and_make_the_same_shards(tmp_path, zst):
    """Ray tasks may run on other machines, which cannot read this one's spill files: there a piece carries
    its bytes, and the shards are those of the local pool, which spills."""
    local, ray = local_and_ray_shards(tmp_path, lambda: None, inputs=[str(zst[0])], unit_bytes=64 << 10, workers=2,
                                      shard_size="64KB", progress=False)
    assert local == ray and len(local) > 2


