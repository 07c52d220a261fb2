"""A run stopped at its very start (Ctrl-C before the first journal save) leaves nothing that the rerun takes for
another tool's file: the journal goes before the error log, since the journal is what makes the log ours."""

import pytest

from dataflow.preprocess import startup
from dataflow.preprocess.config import TokenizeConfig
from dataflow.preprocess.run import tokenize
from tools.repo_data import gpt2_json


def test_a_run_stopped_before_its_first_journal_save_is_rerun_without_a_refusal(kjv, tmp_path, monkeypatch):
    out = tmp_path / "out"
    config = TokenizeConfig(inputs=[str(kjv)], out=str(out), tokenizer=str(gpt2_json()), workers=1, progress=False)
    saving = startup.save_progress

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C as the first journal is saved

    monkeypatch.setattr(startup, "save_progress", stopped)
    with pytest.raises(KeyboardInterrupt):
        tokenize(config)
    monkeypatch.setattr(startup, "save_progress", saving)
    summary = tokenize(config)  # refused before: "out/_errors.jsonl: a file this run would write is already there"
    assert summary.documents > 0 and (out / "index.json").exists()
