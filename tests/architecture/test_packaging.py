"""The wheel carries every package and the built-in configs: pyproject lists packages by hand (configs/ ships
as trainer.configs, which discovery cannot see), so a new package must not be forgotten there."""

from __future__ import annotations

import pathlib
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for top in ("dataflow", "trainer") for p in (ROOT / top).rglob("__init__.py")}
    assert found <= listed, f"add {sorted(found - listed)} to [tool.setuptools] packages in pyproject.toml"
    assert "trainer.configs" in listed


def test_the_configs_ship_as_package_data():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setup["package-dir"]["trainer.configs"] == "configs"
    assert "*.toml" in setup["package-data"]["trainer.configs"]
    assert list((ROOT / "configs").glob("*.toml"))
