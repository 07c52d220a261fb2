"""A local folder and an object store are two implementations of one output interface (issue 35, step 4):
`layout_of` picks one from -o, and no other module of the tokenize pipeline asks which kind it writes."""

from __future__ import annotations

import ast
import pathlib

from dataflow.formats.manifest import TOKENIZE_WORK_DIR
from dataflow.preprocess.config import TokenizeConfig
from dataflow.preprocess.layout import FolderLayout, OutputLayout, StoreLayout, layout_of

PREPROCESS = pathlib.Path(__file__).resolve().parents[2] / "dataflow" / "preprocess"


def test_a_folder_and_a_url_get_the_two_layouts_with_the_same_names(tmp_path, monkeypatch):
    monkeypatch.setenv("DATAFLOW_CACHE", str(tmp_path / "cache"))
    folder = layout_of(TokenizeConfig(inputs=["a"], out=str(tmp_path / "ds"), val_fraction=0.1).resolve())
    store = layout_of(TokenizeConfig(inputs=["a"], out="s3://bucket/ds", val_fraction=0.1, num_tasks=2,
                                     task_index=1).resolve())
    assert isinstance(folder, FolderLayout) and isinstance(store, StoreLayout)
    assert isinstance(folder, OutputLayout) and isinstance(store, OutputLayout) and not hasattr(store, "remote")
    assert folder.work_root == str(tmp_path / "ds" / TOKENIZE_WORK_DIR) and folder.work_in_output() == folder.work_root
    assert folder.errors == folder.errors_url == str(tmp_path / "ds" / "_errors.jsonl")
    assert folder.rename_dirs() == {"train": str(tmp_path / "ds" / "train"), "val": str(tmp_path / "ds" / "val")}
    assert folder.upload_dirs() is None
    assert store.work_root.startswith(str(tmp_path / "cache")) and store.work_in_output() is None
    assert store.errors_url == "s3://bucket/ds/_errors-00001.jsonl" and store.errors.startswith(store.work_root)
    assert store.upload_dirs() == {"train": "s3://bucket/ds/train/part-00001", "val": "s3://bucket/ds/val/part-00001"}
    assert store.rename_dirs() is None and store.staging_dir("train") == store.work


def test_only_the_layout_tells_a_folder_from_an_object_store():
    """No `.remote` flag to branch on: the run, its start, its end and the ownership rules call the layout."""
    found = []
    for path in sorted(PREPROCESS.glob("*.py")):
        if path.name in ("layout.py", "output.py", "merge.py"):  # the interface; the store's helpers; merge
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "remote" and ast.unparse(node.value).endswith("layout"):
                found.append(f"{path.name}:{node.lineno}")
    assert not found, found
    layout = ast.parse((PREPROCESS / "layout.py").read_text())
    assert not [n for n in ast.walk(layout) if isinstance(n, ast.Assign)
                and any(getattr(t, "id", None) == "WORK_DIR" for t in n.targets)], "layout.WORK_DIR: the manifest's"
