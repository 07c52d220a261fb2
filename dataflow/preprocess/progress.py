"""The progress bar of `dataflow tokenize`: uncompressed input bytes, with a rate and an ETA.

Plain inputs count their size. A compressed file's decompressed size is unknown until it has been read,
so its share of the total is estimated from the ratio seen so far (decompressed bytes of its pieces
over compressed bytes read), starting from a guess, and corrected as its pieces are committed.
"""

from __future__ import annotations

from tqdm import tqdm

from dataflow.sources import splits_into_pieces
from dataflow.sources.records import Unit

GUESSED_RATIO = 4.0  # decompressed / compressed bytes of JSONL text before a piece says otherwise


class InputProgress:
    """tqdm over the uncompressed bytes of a run's units, `done` of them committed before this run."""

    def __init__(self, units: list[Unit], done: int, enabled: bool = True) -> None:
        self._estimate = {u.index: u.size * GUESSED_RATIO if splits_into_pieces(u) else u.size for u in units}
        self._read: dict[int, int] = {}  # decompressed bytes committed so far, per compressed unit
        self._open = {u.index for u in units[done:] if splits_into_pieces(u)}  # sizes still estimated
        self.bar = tqdm(total=int(sum(self._estimate.values())),
                        initial=int(sum(self._estimate[u.index] for u in units[:done])), unit="B", unit_scale=True,
                        desc=self._desc(), disable=not enabled, dynamic_ncols=True)

    def _desc(self) -> str:
        """'tokenize', or 'tokenize (total estimated)' while a compressed input's size is still a guess."""
        return "tokenize (total estimated)" if self._open else "tokenize"

    def advance(self, unit: Unit, plan_size: int, documents: int, tokens: int) -> None:
        """Count one committed unit or piece (`plan_size`: its plan unit's input bytes)."""
        if unit.piece < 0:
            self.bar.update(unit.size)
        else:
            self._read[unit.index] = self._read.get(unit.index, 0) + unit.size
            done = self._read[unit.index]
            estimate = done if unit.last else max(done, done * plan_size / max(unit.read, 1))
            self.bar.total = round(self.bar.total - self._estimate[unit.index] + estimate)
            self._estimate[unit.index] = estimate
            if unit.last:
                self._open.discard(unit.index)
                self.bar.set_description(self._desc(), refresh=False)
            self.bar.update(unit.size)
        self.bar.set_postfix(docs=f"{documents:,}", tokens=f"{tokens:,}", refresh=False)  # not tqdm's 3e+4

    def close(self) -> None:
        """End the bar; a run that got this far read everything, so the total is what was counted."""
        self.bar.total = self.bar.n
        self.bar.refresh()
        self.bar.close()
