"""No module of dataflow/ or trainer/ imports one that imports it back, directly or around a circle: every
import counts, those inside functions and under TYPE_CHECKING too (a circle drawn lazily is still a circle in
the design). A `from package import name` is an edge to the submodule `name` when there is one, else to the
package's __init__ (its face)."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("dataflow", "trainer")


def modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> its file, for every module of the packages (a package as its __init__)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """The modules of the packages that `module` imports, anywhere in its file."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node, module, path.name == "__init__.py")
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    out.add(sub)
                elif target in known:
                    out.add(target)
    out.discard(module)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports_of(m, p, known) for m, p in known.items()}


def test_no_module_imports_one_that_imports_it_back():
    found = cycles(graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_nothing_below_the_face_imports_the_package_face():
    """`dataflow/__init__.py` is for users: a module inside that imports it draws every layer above itself."""
    bad = sorted(m for m, deps in graph().items() if "dataflow" in deps and m.startswith("dataflow."))
    assert not bad, f"these import the package face `dataflow` (import the module that owns the name): {bad}"


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# The design's flow, as package levels: a package imports only packages of a lower level (siblings on one level
# know nothing of each other). Level 0 are the top-level helpers of dataflow/ (errors, env, sizes, locks, ...),
# which may import one another (the circle test above keeps that one-way).
LEVELS = {
    "formats": 1,
    "sources": 2, "tokenizers": 2, "audit": 2,  # audit: the data-order log the loader writes and `audit` reads
    "preprocess": 3, "loading": 3,
    "convert": 4, "profiling": 4,
    "dataflow": 5, "dataflow.cli": 5,  # the package face and the command line
    "dataflow.__main__": 6, "trainer": 6,
}


def _level_of(module: str) -> tuple[str, int]:
    parts = module.split(".")
    if parts[0] == "trainer":
        return "trainer", LEVELS["trainer"]
    if module in LEVELS:
        return module, LEVELS[module]
    if len(parts) > 1 and parts[1] in LEVELS:
        return parts[1], LEVELS[parts[1]]
    if len(parts) == 2:  # a top-level helper module of dataflow/
        return module, 0
    raise AssertionError(f"{module}: a package the flow does not place; add it to LEVELS")


def test_packages_import_only_downward():
    bad = []
    for module, deps in sorted(graph().items()):
        (name, level) = _level_of(module)
        for dep in sorted(deps):
            (dep_name, dep_level) = _level_of(dep)
            if dep_name != name and dep_level >= level and not (level == dep_level == 0):
                bad.append(f"{module} (level {level}) imports {dep} (level {dep_level})")
    assert not bad, "imports that run up or across the flow:\n" + "\n".join(bad)
