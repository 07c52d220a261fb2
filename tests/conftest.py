import os
import pathlib
import tempfile

import pytest

SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
if not SHARED.exists():  # CI checkouts may sit elsewhere; DATAFLOW_SHARED_DATA points at ../shared/data
    SHARED = pathlib.Path(os.environ.get("DATAFLOW_SHARED_DATA", SHARED))

# Tests prove tokenizer equivalence themselves: never reuse a proof remembered by an earlier run.
os.environ["DATAFLOW_PROOF_CACHE"] = tempfile.mkdtemp(prefix="dataflow-proofs-")

KJV = SHARED / "corpus" / "kjv.jsonl.zst"
GPT2_JSON = SHARED / "tokenizers" / "gpt2" / "tokenizer.json"
GPT2_TIKTOKEN = SHARED / "tokenizers" / "gpt2" / "gpt2.tiktoken"


@pytest.fixture(scope="session")
def kjv() -> pathlib.Path:
    if not KJV.exists():
        pytest.fail(f"real test data missing: {KJV}")
    return KJV
