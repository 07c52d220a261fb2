"""No function in dataflow/, trainer/ or tools/ is longer than 80 lines (a newcomer reads one in a screen)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIMIT = 80


def long_functions(folder: pathlib.Path) -> list[str]:
    out = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LIMIT:
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} has {lines} lines")
    return out


def test_no_function_over_80_lines():
    found = long_functions(ROOT / "dataflow") + long_functions(ROOT / "trainer") + long_functions(ROOT / "tools")
    assert not found, "\n".join(found)
