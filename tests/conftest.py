import os
import pathlib

import pytest

SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
if not SHARED.exists():  # CI checkouts may sit elsewhere; DATAFLOW_SHARED_DATA points at ../shared/data
    SHARED = pathlib.Path(os.environ.get("DATAFLOW_SHARED_DATA", SHARED))

KJV = SHARED / "corpus" / "kjv.jsonl.zst"
GPT2_JSON = SHARED / "tokenizers" / "gpt2" / "tokenizer.json"
GPT2_TIKTOKEN = SHARED / "tokenizers" / "gpt2" / "gpt2.tiktoken"


@pytest.fixture(scope="session")
def kjv() -> pathlib.Path:
    if not KJV.exists():
        pytest.fail(f"real test data missing: {KJV}")
    return KJV
