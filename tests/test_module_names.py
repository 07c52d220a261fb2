"""A module name says one job: the profiler's modules share no file name with another package's."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _is_alias(path: pathlib.Path) -> bool:
    """A module that only re-exports another under an old name (a docstring, imports, `__all__`)."""
    body = ast.parse(path.read_text()).body
    return all(isinstance(n, (ast.Import, ast.ImportFrom)) or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
               or (isinstance(n, ast.Assign) and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["__all__"])
               for n in body)


def test_profiling_modules_have_names_of_their_own():
    profiling = {p.stem for p in (ROOT / "dataflow" / "profiling").glob("*.py") if not _is_alias(p)} - {"__init__"}
    others = {p.stem: p for p in [*ROOT.joinpath("dataflow").rglob("*.py"), *ROOT.joinpath("trainer").rglob("*.py")]
              if "profiling" not in p.parts}
    twins = sorted(f"profiling/{m}.py and {others[m].relative_to(ROOT)}" for m in profiling & set(others))
    assert not twins, twins


def test_the_old_name_of_the_command_module_is_only_an_alias():
    from dataflow.profiling import cli, subcommand

    assert _is_alias(ROOT / "dataflow" / "profiling" / "cli.py")
    assert cli.add_profile_parser is subcommand.add_profile_parser


def test_the_profile_subcommand_still_answers():
    out = subprocess.run([sys.executable, "-m", "dataflow", "profile", "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0 and "--step-ms" in out.stdout and "--sweep" in out.stdout
