"""A module name says one job: the profiler's modules share no file name with another package's."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_profiling_modules_have_names_of_their_own():
    profiling = {p.stem for p in (ROOT / "dataflow" / "profiling").glob("*.py")} - {"__init__"}
    others = {p.stem: p for p in [*ROOT.joinpath("dataflow").rglob("*.py"), *ROOT.joinpath("trainer").rglob("*.py")]
              if "profiling" not in p.parts}
    twins = sorted(f"profiling/{m}.py and {others[m].relative_to(ROOT)}" for m in profiling & set(others))
    assert not twins, twins


def test_the_profile_subcommand_still_answers():
    out = subprocess.run([sys.executable, "-m", "dataflow", "profile", "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0 and "--step-ms" in out.stdout and "--sweep" in out.stdout
