"""A folder of splits (what `dataflow tokenize --val-fraction` writes) given where one dataset is expected is
a usage mistake: exit 2, naming the datasets to pass instead."""

import os
import shutil

import pytest

from dataflow import ConfigError, StreamingDataset
from dataflow.cli import main


@pytest.fixture(scope="module")
def splits(kjv, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("splits") / "kjv")
    assert main(["tokenize", str(kjv), "-o", out, "--val-fraction", "0.1", "--format", "tar", "--workers", "1",
                 "--no-progress"]) == 0
    return out


@pytest.mark.parametrize("command", [["inspect"], ["inspect", "--decode", "2"], ["verify", "--no-progress"],
                                     ["decode", "--no-progress"]])
@pytest.mark.parametrize("slash", ["", "/"])
def test_a_folder_of_splits_given_as_a_dataset_is_a_usage_error(splits, capsys, command, slash):
    code = main([command[0], splits + slash, *command[1:]])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "holds the splits train, val" in err
    assert f"{os.path.join(splits, 'train')} or {os.path.join(splits, 'val')}" in err


def test_the_loader_says_which_split_to_pass(splits):
    with pytest.raises(ConfigError, match=r"pass one of them, e\.g\. .*/kjv/train or .*/kjv/val"):
        StreamingDataset(splits, seq_len=16)
    assert len(StreamingDataset(os.path.join(splits, "val"))) > 0  # each split is a dataset


def test_a_folder_with_only_a_train_split_names_it(splits, tmp_path, capsys):
    folder = tmp_path / "only-train"
    shutil.copytree(os.path.join(splits, "train"), folder / "train")
    assert main(["verify", str(folder), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"holds the split train, not a dataset; pass {folder / 'train'} (" in err and "/val" not in err
