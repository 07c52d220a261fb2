"""`dataflow convert`: other projects' token files in and out, same documents in the same order.

- `megatron`: Megatron-LM's indexed dataset (PREFIX.bin + PREFIX.idx), read and written to its layout.
- `nanogpt`: nanoGPT's flat uint16 token file, split at (or joined with) EOS.
- `common`: the tokenizer behind --tokenizer, local inputs, our datasets read back in batches.
- `outputs`: the rule for every output (also `dataflow decode -o`): replaced only with --overwrite, never a
  device or FIFO, whole or not at all; `upload`: outputs at URLs, staged locally and uploaded when whole.
- `run`: the four conversions; `command`: the CLI (`add_convert_parser`).

They write only through the public `ShardWriter` and read only through `dataflow.formats.reader`.
"""
