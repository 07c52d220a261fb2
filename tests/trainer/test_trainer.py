"""The trainer's parts without a training run: config, model, schedule, metrics, checkpoint safety."""

from __future__ import annotations

import os
import pickle
import pathlib

import pytest
import torch

from dataflow.errors import ConfigError, FormatError
from trainer.__main__ import main
from trainer.checkpoint import SafeReader, complete_checkpoints, resolve_resume
from trainer.config import TrainConfig, load_config, parse_value
from trainer.metrics import PEAK_BF16_FLOPS, peak_flops
from trainer.model import GPT, document_mask
from trainer.optim import lr_at

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


# --- config ---------------------------------------------------------------------------------------
def test_unknown_key_and_section_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.stepz"):
        load_config(None, ["train.stepz=3", "data.path=x"])
    bad = tmp_path / "bad.toml"
    bad.write_text("[optim]\nlr = 1.0\n")
    with pytest.raises(ConfigError, match=r"\[optim\].*bad\.toml"):
        load_config(str(bad))
    bad.write_text("[model]\nn_layers = 2\n")
    with pytest.raises(ConfigError, match=r"model\.n_layers.*n_layer"):
        load_config(str(bad))


@pytest.mark.parametrize("override, message", [
    ("train.steps=abc", r"train\.steps must be int, got str 'abc'"),
    ("train.steps=2.5", r"train\.steps must be int, got float"),
    ("train.lr=true", r"train\.lr must be float, got bool"),
    ("train.parallel=zero", r"train\.parallel = 'zero' is not one of ddp, fsdp, hsdp"),
    ("train.grad_accum=0", r"train\.grad_accum must be positive"),
    ("model.n_head=5", r"model\.d_model \(768\) must split"),
    ("train.min_lr=1.0", r"train\.min_lr .* is above train\.lr"),
    ("train.steps", r"section\.key=value"),
])
def test_bad_values_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["data.path=x", override])


def test_overrides_parse_as_toml_literals_else_strings():
    cfg = load_config(str(CONFIGS / "demo.toml"), ["data.path=/data/kjv train", "train.lr=1e-2", "train.steps=7",
                                                  "train.compile=true", "log.jsonl=\"m.jsonl\"", "train.clip=1"])
    assert cfg.data.path == "/data/kjv train" and cfg.train.lr == 1e-2 and cfg.train.steps == 7
    assert cfg.train.compile is True and cfg.log.jsonl == "m.jsonl"
    assert isinstance(cfg.train.clip, float) and cfg.train.clip == 1.0
    assert parse_value("[1, 2]") == [1, 2] and parse_value("s3://bucket/x") == "s3://bucket/x"


def test_empty_data_path_is_a_config_error():
    with pytest.raises(ConfigError, match="data.path is empty"):
        load_config(str(CONFIGS / "demo.toml"))


def test_main_reports_user_mistakes_in_one_line(tmp_path, capsys):
    assert main(["--config", str(CONFIGS / "demo.toml"), "--set", "data.path=x", "--set", "train.warmup=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train.warmup" in err and "Traceback" not in err
    missing = tmp_path / "no-such-dataset"
    assert main(["--config", str(CONFIGS / "demo.toml"), "--set", f"data.path={missing}",
                 "--set", f"checkpoint.dir={tmp_path / 'ck'}", "--set", "log.jsonl="]) == 2  # not a dataset: usage
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-dataset" in err and "Traceback" not in err
    assert main(["--config", str(tmp_path / "absent.toml")]) == 2
    assert "absent.toml does not exist" in capsys.readouterr().err


# --- model ----------------------------------------------------------------------------------------
EXPECTED = {  # config -> (parameters with a 50257-token vocabulary, its size class)
    "gpt2-124m.toml": (123_587_328, (110e6, 135e6)),
    "gpt-1b-fsdp.toml": (1_009_068_032, (0.9e9, 1.2e9)),
    "gpt-7b-hsdp.toml": (6_648_762_368, (6.4e9, 7.5e9)),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_gpu_configs_build_on_meta_with_expected_size(name):
    cfg = load_config(str(CONFIGS / name), ["data.path=unused"])
    with torch.device("meta"):
        model = GPT(cfg.model, vocab_size=50257, max_len=cfg.data.seq_len)
    n = model.num_params()
    d, L, V = cfg.model.d_model, cfg.model.n_layer, model.padded_vocab
    assert V == 50304
    assert n == V * d + L * (12 * d * d + 2 * d) + d == EXPECTED[name][0]  # tied embedding counted once
    lo, hi = EXPECTED[name][1]
    assert lo < n < hi
    T = cfg.data.seq_len
    assert model.flops_per_token(T) == 6 * n + 12 * L * cfg.model.n_head * (d // cfg.model.n_head) * T


def test_document_mask_isolates_documents():
    cfg = load_config(None, ["data.path=x", "model.n_layer=2", "model.n_head=2", "model.d_model=32"]).model
    torch.manual_seed(0)
    model = GPT(cfg, vocab_size=50, max_len=16)
    model.init_weights(0)
    model.eval()
    doc_a, doc_b = torch.randint(0, 50, (1, 6)), torch.randint(0, 50, (1, 10))
    packed = torch.cat([doc_a, doc_b], dim=1)
    positions = torch.cat([torch.arange(6), torch.arange(10)])[None]
    with torch.no_grad():
        packed_logits = model(packed, position_ids=positions)
        alone_b = model(doc_b)
        alone_a = model(doc_a)
        plain = model(packed)
    torch.testing.assert_close(packed_logits[:, 6:], alone_b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed_logits[:, :6], alone_a, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(plain[:, 6:], alone_b, atol=1e-3)  # without the mask, doc b sees doc a
    mask = document_mask(positions)
    assert mask.shape == (1, 1, 16, 16) and not mask[0, 0, 6, 5] and mask[0, 0, 7, 6] and not mask[0, 0, 6, 7]


def test_model_is_causal_and_tied():
    cfg = load_config(None, ["data.path=x", "model.n_layer=1", "model.n_head=2", "model.d_model=16"]).model
    model = GPT(cfg, vocab_size=30, max_len=8)
    model.init_weights(3)
    assert model.lm_head.weight is model.tok_emb.weight
    x = torch.randint(0, 30, (2, 8))
    y = x.clone()
    y[:, 5:] = (y[:, 5:] + 1) % 30
    with torch.no_grad():
        assert torch.equal(model(x)[:, :5], model(y)[:, :5])
    assert model(x).shape == (2, 8, 30)  # padded vocabulary entries are cut off


def test_init_is_a_function_of_the_seed():
    cfg = load_config(None, ["data.path=x", "model.n_layer=1", "model.n_head=2", "model.d_model=16"]).model
    a, b, c = (GPT(cfg, 30, 8) for _ in range(3))
    a.init_weights(1)
    b.init_weights(1)
    c.init_weights(2)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.tok_emb.weight, c.tok_emb.weight)


# --- schedule and metrics -------------------------------------------------------------------------
def test_lr_schedule_warmup_then_decay():
    cfg = TrainConfig(steps=110, warmup_steps=10, lr=1.0, min_lr=0.1, decay="cosine")
    assert lr_at(1, cfg) == pytest.approx(0.1) and lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55) and lr_at(110, cfg) == pytest.approx(0.1)
    values = [lr_at(s, cfg) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    cfg.decay = "linear"
    assert lr_at(35, cfg) == pytest.approx(0.1 + 0.75 * 0.9)
    cfg.decay = "constant"
    assert lr_at(100, cfg) == 1.0


def test_peak_flops_known_only_on_listed_gpus():
    assert peak_flops(torch.device("cpu")) is None
    assert PEAK_BF16_FLOPS["H100"] == PEAK_BF16_FLOPS["H200"] == 989e12 and PEAK_BF16_FLOPS["B200"] == 2.25e15


# --- checkpoint selection and safety --------------------------------------------------------------
def _fake_checkpoint(path: pathlib.Path) -> None:
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"")
    (path / "trainer_state.json").write_text("{}")


def test_resume_auto_picks_newest_complete_checkpoint(tmp_path):
    _fake_checkpoint(tmp_path / "step-000010")
    _fake_checkpoint(tmp_path / "step-000020")
    (tmp_path / "step-000030").mkdir()  # partial: no state file
    _fake_checkpoint(tmp_path / "step-000040.tmp")  # an unfinished save
    assert [s for s, _ in complete_checkpoints(str(tmp_path))] == [10, 20]
    assert resolve_resume(str(tmp_path), "auto").endswith("step-000020")
    assert resolve_resume(str(tmp_path), "none") is None
    assert resolve_resume(str(tmp_path / "nothing-here"), "auto") is None
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        resolve_resume(str(tmp_path), str(tmp_path / "step-000030"))


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_checkpoint_metadata_cannot_run_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".metadata").write_bytes(pickle.dumps(_Evil()))
    with pytest.raises(FormatError, match="not allowed"):
        SafeReader(str(tmp_path)).read_metadata()
    assert not (tmp_path / "pwned").exists()
