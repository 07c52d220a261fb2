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
