"""A checkpoint folder is data: loading its `.metadata` resolves only the exact globals DCP writes, so no
name, dotted or not, can reach code (os.system, eval, torch.load ...)."""

from __future__ import annotations

import io
import os
import pickle
import pickletools

import pytest
import torch

from dataflow.errors import FormatError
from trainer.checkpoint import ALLOWED_GLOBALS, Checkpointer, SafeReader, resolve_resume
from trainer.config import ModelConfig
from trainer.model import GPT
from trainer.parallelize import Dist

MARK = "pwned-by-checkpoint"


def _model() -> GPT:
    return GPT(ModelConfig(n_layer=1, n_head=2, d_model=16), vocab_size=64, max_len=8)


def _save_real_checkpoint(root) -> str:
    """A checkpoint written the way the trainer writes it: a GPT in bf16 and AdamW after one step."""
    torch.manual_seed(0)
    model = _model().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 64, (2, 8))
    model(x, x).backward()
    opt.step()
    state = {"loader": {}, "counters": {"skipped": 0, "bad_in_row": 0, "tokens": 0, "loss_ema": None}}
    return Checkpointer(str(root), keep=2, d=Dist()).save(1, model, opt, state)


class _Recorder(pickle.Unpickler):
    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data))
        self.seen: set[tuple[str, str]] = set()

    def find_class(self, module: str, name: str):
        self.seen.add((module, name))
        return super().find_class(module, name)


def test_every_global_the_current_torch_writes_is_allowed_and_the_metadata_loads(tmp_path):
    path = _save_real_checkpoint(tmp_path)
    with open(os.path.join(path, ".metadata"), "rb") as f:
        recorder = _Recorder(f.read())
    recorder.load()
    assert recorder.seen, "the metadata names no globals at all?"
    assert recorder.seen <= ALLOWED_GLOBALS, sorted(recorder.seen - ALLOWED_GLOBALS)
    metadata = SafeReader(path).read_metadata()
    assert any(key.startswith("model.") for key in metadata.state_dict_metadata)


def test_no_allowed_name_is_dotted():
    assert ALLOWED_GLOBALS and all("." not in name for _, name in ALLOWED_GLOBALS)


def _short(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def proto4_call(module: str, name: str, arg: str) -> bytes:
    """A protocol-4 pickle calling module:name(arg), the name resolved by STACK_GLOBAL (dots followed)."""
    return b"\x80\x04" + _short(module) + _short(name) + b"\x93" + _short(arg) + b"\x85R."


def proto0_call(module: str, name: str, arg: str) -> bytes:
    """The same through protocol 0's GLOBAL opcode."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n(V" + arg.encode() + b"\ntR."


GADGETS = [
    ("torch.distributed.checkpoint.metadata", "os.system"),  # reaches os through the module's own import
    ("torch.distributed.checkpoint.metadata", "torch.load"),
    ("torch.distributed.checkpoint.filesystem", "pickle.loads"),
    ("torch.serialization", "_get_layout.__globals__.get"),
    ("torch", "load"),
    ("torch", "Size.__class__"),
    ("pathlib", "os.system"),
    ("collections", "OrderedDict.__init_subclass__"),
    ("builtins", "eval"),
    ("os", "system"),
    ("posix", "system"),
    ("subprocess", "getoutput"),
]


@pytest.mark.parametrize("module,name", GADGETS)
@pytest.mark.parametrize("encode", [proto4_call, proto0_call])
def test_gadgets_are_refused_before_anything_runs(tmp_path, monkeypatch, module, name, encode):
    monkeypatch.chdir(tmp_path)
    payload = encode(module, name, f"touch {MARK}")
    pickletools.dis(payload, out=io.StringIO())  # a well-formed pickle: refused for what it names
    (tmp_path / ".metadata").write_bytes(payload)
    with pytest.raises(FormatError, match="not allowed"):
        SafeReader(str(tmp_path)).read_metadata()
    assert not (tmp_path / MARK).exists()


def test_the_dotted_gadget_is_refused_inside_a_real_checkpoint_resumed_by_the_trainer(tmp_path, monkeypatch):
    """The attack of the issue: a real checkpoint whose .metadata was swapped, picked by resume = "auto"."""
    monkeypatch.chdir(tmp_path)
    path = _save_real_checkpoint(tmp_path / "ckpt")
    with open(os.path.join(path, ".metadata"), "wb") as f:
        f.write(proto4_call("torch.distributed.checkpoint.metadata", "os.system", f"touch {MARK}"))
    assert resolve_resume(str(tmp_path / "ckpt"), "auto") == path
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(FormatError, match="os.system"):
        Checkpointer(str(tmp_path / "ckpt"), keep=2, d=Dist()).load(path, model, opt)
    assert not (tmp_path / MARK).exists()


@pytest.mark.parametrize("payload", [b"", b"\x80\x04", b"not a pickle at all",
                                     pickle.dumps({"a": 1}), pickle.dumps([1, 2, 3])])
def test_metadata_that_is_not_metadata_is_one_format_error(tmp_path, payload):
    (tmp_path / ".metadata").write_bytes(payload)
    with pytest.raises(FormatError, match=r"\.metadata"):
        SafeReader(str(tmp_path)).read_metadata()
