"""The tokenize settings resolved once (issue 35, step 3): `TokenizeConfig.resolve()` gives a frozen config with
sizes as integers and the split list; a run computes its output settings (the input digest, the tokenizer's)
once, however many checks and manifests read them; and the command line's flags are the config's fields."""

from __future__ import annotations

import dataclasses
import json

import pytest

from support.data import GPT2_JSON
from dataflow.cli import build_parser, main
from dataflow.errors import ConfigError
from dataflow.preprocess import config as config_mod
from dataflow.preprocess.config import TokenizeConfig
from dataflow.preprocess.plan import DEFAULT_UNIT_BYTES


@pytest.fixture()
def src(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": f"document {i} " * 40}) + "\n" for i in range(300)))
    return path


def test_resolve_gives_a_frozen_config_of_integers_and_splits(tmp_path):
    cfg = TokenizeConfig(inputs=["a.jsonl"], out=str(tmp_path / "o"), shard_size="1MB", workers=3,
                         val_fraction=0.1).resolve()
    assert (cfg.shard_size, cfg.unit_bytes, cfg.workers, cfg.splits) == (1 << 20, DEFAULT_UNIT_BYTES, 3,
                                                                        ("train", "val"))
    assert TokenizeConfig(inputs=["a"], out="o", unit_bytes=1 << 20).resolve().splits == ("train",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.shard_size = 7
    with pytest.raises(ConfigError, match="--val-fraction"):  # resolving checks first
        TokenizeConfig(inputs=["a"], out="o", val_fraction=1.5).resolve()


def test_a_run_digests_its_inputs_and_tokenizer_once(src, tmp_path, monkeypatch):
    """A fresh run, its resume and a rerun of the finished run each compute the output settings once (the
    input digest of a million files, the tokenizer file's sha256), not once per check and manifest."""
    calls = []
    digest = config_mod.input_digest
    monkeypatch.setattr(config_mod, "input_digest", lambda inputs: calls.append(1) or digest(inputs))
    args = ["tokenize", str(src), "--tokenizer", str(GPT2_JSON), "--val-fraction", "0.2", "--unit-size", "64KB",
            "--workers", "1", "--no-progress"]
    for out in ("a", "a"):  # the second: already complete
        calls.clear()
        assert main([*args, "-o", str(tmp_path / out)]) == 0
        assert len(calls) == 1, len(calls)


def test_every_setting_is_a_flag_of_tokenize_and_back(capsys):
    """Each field of TokenizeConfig is an argument of `dataflow tokenize`, with its help; the parsed arguments
    give the config back."""
    from dataflow.preprocess.command import config_of

    with pytest.raises(SystemExit):
        main(["tokenize", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for f in dataclasses.fields(TokenizeConfig):
        assert f.metadata["flag"][-1] in shown and " ".join(f.metadata["help"].split()[:4]) in shown, f.name
    args = build_parser().parse_args(["tokenize", "x", "-o", "y", "--unit-size", "1MB", "--no-progress",
                                      "--workers", "2", "--no-eos"])
    assert config_of(args) == TokenizeConfig(inputs=["x"], out="y", unit_bytes=1 << 20, progress=False, workers=2,
                                             eos=False, shard_size="128MB")
