"""Data flows one way: lower layers never import upper ones (checked on the source, import by import)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]

# package -> packages it must never import
FORBIDDEN = {
    "dataflow": ("trainer",),
    "dataflow/formats": ("dataflow.loading", "dataflow.preprocess", "dataflow.profiling", "trainer"),
    "dataflow/loading": ("dataflow.profiling", "dataflow.preprocess", "trainer"),
    "dataflow/profiling": ("dataflow.preprocess", "trainer"),
    # the data-order audit: the loader writes through audit/log.py, so the audit never imports the loader
    "dataflow/audit": ("dataflow.loading", "dataflow.preprocess", "dataflow.profiling", "trainer"),
    # input files -> records (tokenize's readers): they know nothing of what reads them
    "dataflow/sources": ("dataflow.preprocess", "dataflow.tokenizers", "dataflow.convert", "dataflow.cli",
                         "dataflow.loading", "dataflow.profiling", "trainer"),
    # text -> ids: used by tokenize, convert, decode and the CLI, and knows none of them
    "dataflow/tokenizers": ("dataflow.preprocess", "dataflow.convert", "dataflow.cli", "dataflow.loading",
                            "dataflow.profiling", "trainer"),
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
    ("handoff", "watchdog"),  # the worker pool; the loader's watch on its waits
    ("ring",),
    ("dataset",),  # StreamingDataset: the public face
    ("reader",),  # per-process open shards
    ("index", "shards"),
    ("storage",),
    ("decoded", "download", "holds", "ahead"),  # holds: entries in use; ahead: fetch-ahead in the order of need
    ("ranged",),  # a remote shard's record batches by ranged GETs, kept by its download in flight
    ("cache", "link"),  # link: the ranged GETs of one Storage, in the order of need
    ("mixing", "shuffle", "stages"),
    ("contract",),  # the doors: BatchSource, SampleSource, FillReport
    ("cursor",),
    ("plan",),
    ("worker_exit",),  # how a worker ended, said for a person
]


def _sibling_imports(path: pathlib.Path, package: str = "dataflow.loading") -> set[str]:
    """The modules of `package` (e.g. dataflow.loading) that a module imports."""
    depth = package.count(".") + 1
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == package:
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package + "."):
            found.add(node.module.split(".")[depth])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[depth] for a in node.names if a.name.startswith(package + "."))
    return found


def test_loading_modules_import_only_downward():
    rank = {m: i for i, layer in enumerate(LOADING_LAYERS) for m in layer}
    files = {p.stem for p in (ROOT / "dataflow" / "loading").glob("*.py")} - {"__init__"}
    assert files == set(rank), f"place each loading module in LOADING_LAYERS: {sorted(files ^ set(rank))}"
    bad = [f"loading/{m}.py imports loading/{n}.py (not below it)"
           for m in sorted(files) for n in sorted(_sibling_imports(ROOT / "dataflow" / "loading" / f"{m}.py"))
           if rank[n] <= rank[m]]
    assert not bad, "\n".join(bad)


def test_preprocess_never_imports_the_loader_or_the_profiler():
    bad = [f"{p.relative_to(ROOT)} imports {name}" for p in sorted((ROOT / "dataflow" / "preprocess").rglob("*.py"))
           for name in _imports(p) if name.split(".")[:2] in (["dataflow", "loading"], ["dataflow", "profiling"])]
    assert not bad, "\n".join(bad)


# Inside preprocess/: roles from the top. A module's role is its file name (wherever it sits under
# preprocess/, so moving readers into preprocess/readers/ keeps the guard); every module under
# preprocess/readers/ is a reader. A module never imports one of a role above its own.
PREPROCESS_ROLES = [
    ("command",),  # `dataflow tokenize`'s arguments and summary (the CLI's door into preprocess)
    ("run", "merge", "decode"),  # the commands: `dataflow tokenize` (plans, drives, commits, resumes), merge, decode
    ("finish",),  # the manifests: the commit point
    ("startup",),  # the checks before any commit, the journal's start
    ("task",),  # one task's run: its resolved settings, layout, plan and journal
    ("ownership",),  # which files in the output are the run's own
    ("layout",),  # where one task writes
    ("config",),  # the run's settings
    ("executors",),  # local pool / Ray: runs bundles of units on workers
    ("commit", "progress"),  # the coordinator's records of finished work
    ("worker",),  # one bundle: read, tokenize, write finished shards
    ("plan", "output", "journal"),  # the cut into units; local or object-store output; the journal's format
    ("readers",),  # reading inputs: every module under readers/
]
READER_ROLE = "readers"


def _preprocess_role(module: str) -> str | None:
    """The role of `dataflow.preprocess.X[.Y]` (None for a module outside the role list: unconstrained)."""
    parts = module.split(".")[2:]
    if not parts:
        return None
    if parts[0] == READER_ROLE:
        return READER_ROLE
    roles = {m for layer in PREPROCESS_ROLES for m in layer}
    return parts[-1] if parts[-1] in roles else None


def _preprocess_imports(path: pathlib.Path, package_root: pathlib.Path) -> set[str]:
    """Modules of dataflow.preprocess that `path` imports (absolute or relative, `from P import m` too)."""
    here = ["dataflow", "preprocess", *path.relative_to(package_root).with_suffix("").parts[:-1]]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("dataflow.preprocess.")}


def preprocess_violations(package_root: pathlib.Path) -> list[str]:
    """`A imports B` for each module of the preprocess package at `package_root` that imports a higher role."""
    rank = {m: i for i, layer in enumerate(PREPROCESS_ROLES) for m in layer}
    bad = []
    for path in sorted(package_root.rglob("*.py")):
        me = _preprocess_role("dataflow.preprocess." + ".".join(path.relative_to(package_root).with_suffix("").parts))
        if me is None:
            continue
        for name in sorted(_preprocess_imports(path, package_root)):
            other = _preprocess_role(name)
            if other is not None and rank[other] < rank[me]:
                bad.append(f"preprocess/{path.relative_to(package_root)} ({me}) imports {name} ({other})")
    return bad


def test_preprocess_roles_import_only_downward():
    root = ROOT / "dataflow" / "preprocess"
    roles = {m for layer in PREPROCESS_ROLES for m in layer} - {READER_ROLE}
    files = {p.stem for p in root.glob("*.py")} - {"__init__"}
    assert files == roles, f"place each preprocess module in PREPROCESS_ROLES: {sorted(files ^ roles)}"
    bad = preprocess_violations(root)
    assert not bad, "\n".join(bad)


def test_the_preprocess_guard_catches_an_upward_import_wherever_the_readers_live(tmp_path):
    pkg = tmp_path / "preprocess"
    (pkg / "readers").mkdir(parents=True)
    (pkg / "run.py").write_text("from dataflow.preprocess import executors, worker\n")
    (pkg / "worker.py").write_text("from dataflow.preprocess.readers.blocks import read_unit_blocks\n")
    (pkg / "readers" / "blocks.py").write_text("from ..worker import BundleResult\n")  # upward: relative
    (pkg / "readers" / "text.py").write_text("import dataflow.preprocess.journal\n")  # upward: any reader
    (pkg / "plan.py").write_text("from dataflow.preprocess import run\n")  # upward: a reader's peer
    (pkg / "executors.py").write_text("from dataflow.preprocess.run import main\n")  # upward
    assert preprocess_violations(pkg) == [
        "preprocess/executors.py (executors) imports dataflow.preprocess.run (run)",
        "preprocess/plan.py (plan) imports dataflow.preprocess.run (run)",
        "preprocess/readers/blocks.py (readers) imports dataflow.preprocess.worker (worker)",
        "preprocess/readers/text.py (readers) imports dataflow.preprocess.journal (journal)",
    ]


# Inside tokenizers/: layers from the top, as in loading/.
TOKENIZER_LAYERS = [
    ("load",),  # load_tokenizer, tokenizer_for_dataset, TiktokenTokenizer: the package's door
    ("hf_tokenizer",),  # a tokenizer.json: its chosen engine alone encodes
    ("choose", "base", "tiktoken_names", "hub"),  # the engine choice; the Tokenizer interface, bytes; tiktoken:NAME;
    # ORG/NAME from the Hub's cache
    ("gigatoken_engine", "tiktoken_files", "hf_reference"),  # the fast engines; .tiktoken files; the reference
    ("tiktoken_engine",),
    ("bpe_convert", "flat"),  # tokenizer.json to merges and ranks; flat (values, offsets) id arrays
]


def test_tokenizer_modules_import_only_downward():
    rank = {m: i for i, layer in enumerate(TOKENIZER_LAYERS) for m in layer}
    root = ROOT / "dataflow" / "tokenizers"
    files = {p.stem for p in root.glob("*.py")} - {"__init__"}
    assert files == set(rank), f"place each tokenizers module in TOKENIZER_LAYERS: {sorted(files ^ set(rank))}"
    bad = [f"tokenizers/{m}.py imports tokenizers/{n}.py (not below it)"
           for m in sorted(files) for n in sorted(_sibling_imports(root / f"{m}.py", "dataflow.tokenizers"))
           if rank[n] <= rank[m]]
    assert not bad, "\n".join(bad)


# Inside sources/: layers from the top, as in loading/ (the package's __init__ is its face, above them all).
SOURCES_LAYERS = [
    ("registry",),  # every input kind by name, and what the run asks through them
    ("cut_process",),  # the coordinator's cut of compressed JSONL, in a process of its own
    ("pieces",),  # one compressed JSONL stream cut into pieces
    ("jsonl", "text"),  # the readers of JSONL and text files
    ("compressed",),  # decompressed streams, checked
    ("listing",),  # input files and their kinds
    ("datasets_folder", "not_inputs"),  # a `datasets` folder's Arrow files; what no reader reads
    ("parquet",),  # Parquet files, and tables as blocks (a `datasets` folder's batches too)
    ("kind",),  # the input-kind protocol and the parsed --text-field
    ("records",),  # Unit, Span, Block, Record
]


def test_sources_modules_import_only_downward():
    rank = {m: i for i, layer in enumerate(SOURCES_LAYERS) for m in layer}
    root = ROOT / "dataflow" / "sources"
    files = {p.stem for p in root.glob("*.py")} - {"__init__"}
    assert files == set(rank), f"place each sources module in SOURCES_LAYERS: {sorted(files ^ set(rank))}"
    bad = [f"sources/{m}.py imports sources/{n}.py (not below it)"
           for m in sorted(files) for n in sorted(_sibling_imports(root / f"{m}.py", "dataflow.sources"))
           if rank[n] <= rank[m]]
    assert not bad, "\n".join(bad)


def test_the_prefetcher_knows_the_loader_only_through_the_contract():
    assert "loader" not in _sibling_imports(ROOT / "dataflow" / "loading" / "prefetch.py")


# Inside formats/: layers from the top, as in loading/ (the package's __init__ is its face: shard_format).
FORMATS_LAYERS = [
    ("verify", "inspect"),  # `dataflow verify`, `dataflow inspect`
    ("writer", "reader"),  # ShardWriter; whole documents back out, shard by shard
    ("shard_formats",),  # the ShardFormat interface, the registry by name, CheckedShard: opened and checked once
    ("arrow", "tar"),  # the two shard formats
    ("arrow_ranges",),  # an Arrow shard's record batch ranges: written beside its layout, read a batch at a time
    ("arrow_columns",),  # what an Arrow record batch and layout must hold, checked
    ("manifest",),  # index.json: the schema, read checked, written atomically
    ("remote", "manifest_bounds"),  # what every remote read shares; how far a manifest is read
    ("remote_errors", "atomic", "hashing", "arrays"),
]


def test_formats_modules_import_only_downward():
    rank = {m: i for i, layer in enumerate(FORMATS_LAYERS) for m in layer}
    root = ROOT / "dataflow" / "formats"
    files = {p.stem for p in root.glob("*.py")} - {"__init__"}
    assert files == set(rank), f"place each formats module in FORMATS_LAYERS: {sorted(files ^ set(rank))}"
    bad = [f"formats/{m}.py imports formats/{n}.py (not below it)"
           for m in sorted(files) for n in sorted(_sibling_imports(root / f"{m}.py", "dataflow.formats"))
           if rank[n] <= rank[m]]
    assert not bad, "\n".join(bad)
