"""One meaning per name (issue 35, step 8): inside `dataflow/` and `trainer/`, a class or type name is defined once,
so that a reader who meets `_Totals`, `Layout` or `Run` in one module may trust it in the next (the trainer's is
`TrainRun`, a tokenize task's `TaskRun`, convert's `ConvertProgress`, the model's `TransformerBlock`)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUARDED = ("dataflow", "trainer")


def type_names(tree: ast.Module) -> set[str]:
    """Classes and CamelCase aliases (`BatchLayout = dict[...]`) a module defines at its top level."""
    names = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    for n in tree.body:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        names.update(t.id for t in targets if isinstance(t, ast.Name) and t.id.lstrip("_")[:1].isupper()
                     and not t.id.isupper())
    return names


def duplicates(root: pathlib.Path, folders: tuple[str, ...] = GUARDED) -> dict[str, list[str]]:
    """Type name -> the modules defining it, for each name defined in more than one module of `folders`."""
    where: dict[str, list[str]] = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for name in type_names(ast.parse(path.read_text(), str(path))):
                where.setdefault(name, []).append(path.relative_to(root).as_posix())
    return {name: files for name, files in where.items() if len(files) > 1}


def test_a_type_name_in_dataflow_and_the_trainer_is_defined_once():
    found = duplicates(ROOT)
    assert not found, "one definition per name (rename one of them):\n" + "\n".join(
        f"{name}: {', '.join(files)}" for name, files in sorted(found.items()))


def test_the_guard_sees_a_second_definition(tmp_path):
    for folder, text in (("loading", "Layout = dict\n"), ("profiling", "class Layout:\n    pass\n")):
        (tmp_path / "dataflow" / folder).mkdir(parents=True)
        (tmp_path / "dataflow" / folder / "m.py").write_text(text + "STAGES = ()\nclass _Own:\n    pass\n")
    assert duplicates(tmp_path) == {"Layout": ["dataflow/loading/m.py", "dataflow/profiling/m.py"],
                                    "_Own": ["dataflow/loading/m.py", "dataflow/profiling/m.py"]}


def test_no_module_is_named_for_a_word_that_means_something_else_here():
    """`unit` is tokenize's work unit (`sources.records.Unit`); size helpers live in `sizes.py`, never `units.py`
    (which read as the home of the work units)."""
    taken = {"units": "the work Unit is sources/records.py's; size helpers are sizes.py"}
    found = [f"{p.relative_to(ROOT)}: {taken[p.stem]}" for folder in GUARDED
             for p in (ROOT / folder).rglob("*.py") if p.stem in taken]
    assert not found, "\n".join(found)
