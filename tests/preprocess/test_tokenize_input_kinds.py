"""Inputs that are not what `dataflow tokenize` reads are refused in one line (exit 2) while the inputs are
listed, before any work: a file that is not a regular one once links are followed (a FIFO blocked for ever, a
link to /dev/zero spun or grew memory without bound), a dataflow dataset or one of its shards (token ids, not
text: it read `index.json` and `tokenizer.json` as JSONL), an Arrow IPC file that is not part of a `datasets`
folder. Links to regular files and to folders keep working, in a walked folder too."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys

import pyarrow as pa
import pytest

from support.data import GPT2_JSON
from support.cli import decoded
from support.cli import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _limited() -> None:
    """A child that would spin or grow without bound is stopped by its limits, not by the machine's."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def tokenize_bounded(src, out) -> tuple[int, str]:
    """The CLI in a child bounded in time and memory (what it refuses here used to hang or eat memory)."""
    try:
        done = subprocess.run([sys.executable, "-m", "dataflow", "tokenize", *map(str, src), "-o", str(out),
                               "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                              preexec_fn=_limited)
    except subprocess.TimeoutExpired:
        return -1, "timed out: it read the input"
    return done.returncode, done.stderr.strip()


def one_line(err: str, *needles: str) -> None:
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def corpus(folder, n: int = 5) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": f"text {i}"}) + "\n"
                                            for i in range(n)))


def special(tmp_path, kind: str):
    """(the path to name, what the refusal must say) for each kind of file that is not a regular one."""
    if kind == "fifo":
        os.mkfifo(tmp_path / "pipe.jsonl")
        return tmp_path / "pipe.jsonl", "named pipe"
    name = {"zero jsonl": "zero.jsonl", "zero txt": "zero.txt"}[kind]
    os.symlink("/dev/zero", tmp_path / name)
    return tmp_path / name, "character device"


@pytest.mark.parametrize("kind, where", [("zero jsonl", "named"), ("zero txt", "named"), ("fifo", "named"),
                                         ("fifo", "in a folder"), ("zero txt", "globbed")])
def test_an_input_that_is_not_a_regular_file_is_refused_before_any_work(tmp_path, kind, where):
    src = tmp_path / "in"
    corpus(src)
    path, said = special(src, kind)
    given = {"named": [src / "a.jsonl", path], "in a folder": [src], "globbed": [str(src / "*")]}[where]
    code, err = tokenize_bounded(given, tmp_path / "out")
    assert code == 2, err
    one_line(err, str(path), said, "not a regular file")
    assert not (tmp_path / "out").exists()  # refused while listing the inputs: no work folder, no journal


def test_a_link_that_leads_nowhere_in_a_walked_folder_is_one_line(tmp_path, capsys):
    corpus(tmp_path / "in")
    os.symlink(tmp_path / "gone.jsonl", tmp_path / "in" / "b.jsonl")
    assert tokenize(tmp_path / "in", tmp_path / "out") == 2
    one_line(capsys.readouterr().err, str(tmp_path / "in" / "b.jsonl"), "does not exist")


def test_links_to_files_and_folders_keep_working_named_and_walked(tmp_path, capsys):
    """A corpus linked in from a cluster file system: a linked file, a linked folder given as input, and a
    linked folder inside a walked one (it was left out of the walk without a word)."""
    corpus(tmp_path / "shared" / "x", 3)
    (tmp_path / "shared" / "y.txt").write_text("a text file")
    (tmp_path / "in").mkdir()
    os.symlink(tmp_path / "shared" / "x", tmp_path / "in" / "linked")
    os.symlink(tmp_path / "shared" / "y.txt", tmp_path / "in" / "z.txt")
    os.symlink(tmp_path / "shared" / "x", tmp_path / "top")
    assert tokenize(tmp_path / "in", tmp_path / "walked") == 0
    assert [d["id"] for d in decoded(tmp_path / "walked", capsys)] == ["d0", "d1", "d2", "z.txt"]
    assert tokenize([tmp_path / "top", tmp_path / "in" / "z.txt"], tmp_path / "named") == 0
    assert [d["id"] for d in decoded(tmp_path / "named", capsys)] == ["d0", "d1", "d2", "in/z.txt"]


def test_a_link_back_to_a_folder_above_it_is_one_line_not_an_endless_walk(tmp_path, capsys):
    corpus(tmp_path / "in" / "sub")
    os.symlink(tmp_path / "in", tmp_path / "in" / "sub" / "loop")
    assert tokenize(tmp_path / "in", tmp_path / "out") == 2
    one_line(capsys.readouterr().err, str(tmp_path / "in" / "sub" / "loop"), "loop")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A dataflow dataset with a val split and its tokenizer's copy (tokenizer.json) beside each manifest."""
    root = tmp_path_factory.mktemp("made")
    corpus(root / "src", 60)
    assert tokenize(root / "src", root / "ds", "--tokenizer", GPT2_JSON, "--val-fraction", "0.2") == 0
    assert (root / "ds" / "train" / "tokenizer.json").exists()
    return root / "ds"


@pytest.fixture
def dataset(tmp_path, made):
    """A copy of the dataset in this test's folder, beside its source folder `src`."""
    corpus(tmp_path / "src", 60)
    shutil.copytree(made, tmp_path / "ds")
    return tmp_path / "ds"


@pytest.mark.parametrize("given", ["train", ".", "train/index.json", "src folder"])
def test_a_dataflow_dataset_given_as_input_says_so_and_how_to_decode_it(tmp_path, capsys, dataset, given):
    if given == "src folder":  # a dataset among the files of a folder of inputs
        os.rename(dataset, tmp_path / "src" / "ds")
        dataset, src = tmp_path / "src" / "ds", tmp_path / "src"
    else:
        src = dataset / given
    capsys.readouterr()
    assert tokenize(src, tmp_path / "again") == 2
    folder = dataset / "train"  # walked, the first dataset met
    one_line(capsys.readouterr().err, f"{folder}: a dataflow dataset", f"dataflow decode {folder}")
    assert not (tmp_path / "again").exists()


def test_a_shard_of_a_dataflow_dataset_names_its_dataset(tmp_path, capsys, dataset):
    shard = dataset / "train" / "shard-00000.arrow"
    capsys.readouterr()
    assert tokenize(shard, tmp_path / "again") == 2
    one_line(capsys.readouterr().err, str(shard), "a shard of the dataflow dataset", str(dataset / "train"),
             "dataflow decode")
    moved = tmp_path / "alone.arrow"  # a shard without its manifest beside it: what it holds says what it is
    os.rename(shard, moved)
    assert tokenize(moved, tmp_path / "again") == 2
    one_line(capsys.readouterr().err, str(moved), "token ids", "dataflow decode")


def test_an_arrow_ipc_file_that_is_not_of_a_datasets_folder_says_what_it_is(tmp_path, capsys):
    path = tmp_path / "table.arrow"
    table = pa.table({"text": ["one", "two"]})
    with pa.ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    assert tokenize(path, tmp_path / "out") == 2
    err = capsys.readouterr().err
    one_line(err, str(path), "an Arrow IPC file", "Parquet")
    assert "save_to_disk" not in err
    stream = tmp_path / "stream.arrow"  # an Arrow stream, as in a `datasets` folder: read as before
    with pa.ipc.new_stream(str(stream), table.schema) as writer:
        writer.write_table(table)
    assert tokenize(stream, tmp_path / "out") == 0
    assert [d["text"] for d in decoded(tmp_path / "out", capsys)] == ["one", "two"]
