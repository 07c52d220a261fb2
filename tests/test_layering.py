"""Data flows one way: lower layers never import upper ones (checked on the source, import by import)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]

# package -> packages it must never import
FORBIDDEN = {
    "dataflow": ("trainer",),
    "dataflow/formats": ("dataflow.loading", "dataflow.preprocess", "dataflow.profiling", "trainer"),
    "dataflow/loading": ("dataflow.profiling", "dataflow.preprocess", "trainer"),
    "dataflow/profiling": ("dataflow.preprocess", "trainer"),
}


def _imports(path: pathlib.Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_lower_layers_never_import_upper_ones():
    bad = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in _imports(path):
                if any(name == f or name.startswith(f + ".") for f in forbidden):
                    bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, "\n".join(bad)


# Inside loading/: layers from the top; a module imports only modules of layers below its own.
LOADING_LAYERS = [
    ("prefetch",),  # the device prefetcher
    ("loader",),  # StreamingDataLoader: plans batches, walks the cursor
    ("handoff",),  # the worker pool
    ("ring",),
    ("dataset",),  # StreamingDataset: the public face
    ("reader",),  # per-process open shards
    ("index", "shards"),
    ("storage",),
    ("decoded", "download"),
    ("cache",),
    ("mixing", "shuffle", "stages"),
    ("contract",),  # the doors: BatchSource, SampleSource, FillReport
    ("cursor",),
    ("plan",),
]


def _loading_imports(path: pathlib.Path) -> set[str]:
    """The sibling modules of loading/ that a loading module imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "dataflow.loading":
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dataflow.loading."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("dataflow.loading."))
    return found


def test_loading_modules_import_only_downward():
    rank = {m: i for i, layer in enumerate(LOADING_LAYERS) for m in layer}
    files = {p.stem for p in (ROOT / "dataflow" / "loading").glob("*.py")} - {"__init__"}
    assert files == set(rank), f"place each loading module in LOADING_LAYERS: {sorted(files ^ set(rank))}"
    bad = [f"loading/{m}.py imports loading/{n}.py (not below it)"
           for m in sorted(files) for n in sorted(_loading_imports(ROOT / "dataflow" / "loading" / f"{m}.py"))
           if rank[n] <= rank[m]]
    assert not bad, "\n".join(bad)


def test_preprocess_never_imports_the_loader_or_the_profiler():
    bad = [f"{p.relative_to(ROOT)} imports {name}" for p in sorted((ROOT / "dataflow" / "preprocess").rglob("*.py"))
           for name in _imports(p) if name.split(".")[:2] in (["dataflow", "loading"], ["dataflow", "profiling"])]
    assert not bad, "\n".join(bad)


def test_the_prefetcher_knows_the_loader_only_through_the_contract():
    assert "loader" not in _loading_imports(ROOT / "dataflow" / "loading" / "prefetch.py")
