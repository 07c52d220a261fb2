"""The data-order audit: what each rank's loader served (`log.py`, written as batches are yielded) and
`dataflow audit DIR`, which replays it (`read.py`, `replay.py`, `text.py`, `command.py`)."""
