"""The readers of `dataflow tokenize`: input files -> work units -> blocks of records, one module per input kind.

The coordinator lists the inputs (`expand_inputs`, `input_kind`), asks each kind how its files are cut into
units (`spans`) and what fields a file's first record has (`first_record_fields`); a worker reads one unit
as blocks of consecutive records (`read_unit_blocks`) and names the records without an id (`default_ids`);
the error log says where a bad record is (`place`: a line or a row). Each kind answers through one
`InputKind` (`kind.py`: the protocol, and `TextFields`, the parsed `--text-field`), found by name in
`registry.py`. Everything a kind knows lives in its own module:

- `jsonl.py`: `.jsonl/.json/.ndjson`, byte ranges of a plain file, parsed in bulk by pyarrow;
- `parquet.py`: Parquet, one unit per row group;
- `text.py`: `.txt`, one document per file;
- `datasets_folder.py`: a Hugging Face `datasets` folder (`save_to_disk`), whole record batches per unit
  (the kind `datasets`; formerly `arrow`, the shard format's name, still understood);
- `compressed.py`: any of them compressed (checked: a cut file is an error), and `pieces.py`, the
  coordinator's cut of one compressed JSONL stream into pieces for the workers, made by a process of its own
  that starts before the tokenizer loads (`cut_process.py`, `read_bundles`).

`listing.py` names files and kinds, and refuses what no reader reads before any work (`not_inputs.py`);
`records.py` holds the `Unit` readers read and the `Block` every reader yields; Arrow arrays are built through
`dataflow.formats.arrays`, which never wakes pandas.
"""

from __future__ import annotations

from dataflow.sources.cut_process import Reading, read_bundles
from dataflow.sources.kind import DEFAULT_SEPARATOR, InputKind, TextFields, parse_text_fields, separator_arg
from dataflow.sources.listing import expand_inputs, input_kind, split_compression
from dataflow.sources.pieces import (compressed_file, expand, pieces, splits_into_pieces,
                                                workers_read_whole)
from dataflow.sources.records import Block, Span
from dataflow.sources.registry import (KINDS, default_ids, fields_word, first_record_fields, kind_of, place,
                                       read_ahead, read_unit_blocks, spans)

__all__ = ["DEFAULT_SEPARATOR", "KINDS", "Block", "InputKind", "Reading", "Span", "TextFields", "compressed_file",
           "default_ids", "expand", "expand_inputs", "fields_word", "first_record_fields", "input_kind", "kind_of",
           "parse_text_fields", "pieces", "place", "read_ahead", "read_bundles", "read_unit_blocks", "separator_arg",
           "spans", "split_compression", "splits_into_pieces", "workers_read_whole"]
