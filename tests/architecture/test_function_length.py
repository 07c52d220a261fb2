"""No function in dataflow/, trainer/ or tools/ is longer than 80 lines (a newcomer reads one in a screen), no module
in dataflow/ or trainer/ longer than 400."""

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


FILE_LIMIT = 400


def test_no_module_over_400_lines():
    """A module over ~400 lines asks to be split (issue 35's done-when): dataflow/ and trainer/ hold none."""
    found = [f"{p.relative_to(ROOT)} has {n} lines" for top in ("dataflow", "trainer")
             for p in sorted((ROOT / top).rglob("*.py")) if (n := len(p.read_text().splitlines())) > FILE_LIMIT]
    assert not found, "\n".join(found)
