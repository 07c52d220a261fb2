"""One meaning per word (issue 22): "ring", "window" and "block" each name one thing in the code, so that a
newcomer who learns a word in one file may trust it in the next. Checked on identifiers (names, attributes,
definitions, arguments, imports), split into words: `SlotRing` has the word "ring", `string` does not."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("dataflow", "trainer")

# word -> (files or folders where it may appear, identifiers allowed anywhere)
ALLOWED = {
    # the worker pool's shared-memory SlotRing and the hand-off that uses it
    "ring": (("dataflow/loading/ring.py", "dataflow/loading/handoff.py"), ()),
    # the shuffle window: `shuffle_window` consecutive shards shuffled together; its code, and the public
    # argument everywhere; `reset_window` is StarvationMonitor's deprecated name of reset_interval
    "window": (("dataflow/loading/shuffle.py", "dataflow/loading/index.py", "dataflow/loading/reader.py",
                "dataflow/loading/dataset.py"), ("shuffle_window", "reset_window")),
    # tokenize's input blocks (its readers, dataflow/sources/, and the pipeline); the POSIX tar 512-byte block; the model's transformer blocks (nanoGPT's word);
    # POSIX's signal mask operation, spelled by the standard library
    "block": (("dataflow/preprocess/", "dataflow/sources/", "dataflow/formats/tar.py", "trainer/model.py", "trainer/parallelize.py"),
              ("SIG_BLOCK",)),
}


def words(identifier: str) -> set[str]:
    """`_ZERO_BLOCK` -> {zero, block}; `SlotRing` -> {slot, ring}; `num_windows` -> {num, window}."""
    found = set()
    for part in identifier.split("_"):
        for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", part):
            w = w.lower()
            found.add(w[:-1] if w.endswith("s") and w[:-1] in ALLOWED else w)
    return found


def identifiers(tree: ast.AST):
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            yield n.id, n.lineno
        elif isinstance(n, ast.Attribute):
            yield n.attr, n.lineno
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield n.name, n.lineno
        elif isinstance(n, ast.arg):
            yield n.arg, n.lineno
        elif isinstance(n, ast.keyword) and n.arg:
            yield n.arg, n.lineno
        elif isinstance(n, ast.alias):
            yield (n.asname or n.name).split(".")[-1], n.lineno


def misuses(root: pathlib.Path) -> list[str]:
    bad = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for name, line in identifiers(ast.parse(path.read_text(), rel)):
                for word in words(name) & ALLOWED.keys():
                    places, names = ALLOWED[word]
                    if name not in names and not any(rel == p or (p.endswith("/") and rel.startswith(p))
                                                     for p in places):
                        bad.append(f"{rel}:{line}: {name!r} uses {word!r} outside its meaning")
    return bad


def test_words_split_as_a_reader_reads_them():
    assert words("SlotRing") == {"slot", "ring"} and words("string") == {"string"}
    assert words("_ZERO_BLOCK") == {"zero", "block"} and words("CurrentWindows") == {"current", "window"}
    assert words("during") == {"during"} and words("blocking") == {"blocking"}


def test_ring_window_and_block_keep_one_meaning():
    bad = misuses(ROOT)
    assert not bad, "one meaning per word (see dataflow/loading/README.md, Words):\n" + "\n".join(bad)


def test_the_guard_catches_a_word_that_drifts_back(tmp_path):
    """The check itself can fail: a second "ring" in the prefetcher and a "block" in the loader are caught."""
    (tmp_path / "dataflow" / "loading").mkdir(parents=True)
    (tmp_path / "trainer").mkdir()
    (tmp_path / "dataflow" / "loading" / "prefetch.py").write_text("class _PinnedRing:\n    pass\n")
    (tmp_path / "dataflow" / "loading" / "reader.py").write_text("def advance(blocks):\n    return blocks\n")
    (tmp_path / "dataflow" / "loading" / "ring.py").write_text("class SlotRing:\n    pass\n")
    bad = misuses(tmp_path)
    assert len(bad) == 3 and all("ring.py" not in b for b in bad)
