"""tilec's non-Python files: the grammar and the code templates are package data (`tilec/grammar/`,
`tilec/templates/`), read through importlib.resources so every install method finds them (venv, --user, --target,
a wheel, an editable checkout)."""
from __future__ import annotations

import importlib.resources
import pathlib


def resource_dir(name: str) -> pathlib.Path:
    """The package-data folder `grammar` or `templates` (a real directory: Jinja's loader and Lark read files)."""
    folder = importlib.resources.files("tilec") / name
    if not folder.is_dir():
        raise FileNotFoundError(f"tilec's {name}/ folder is missing from this installation; reinstall tilec")
    return pathlib.Path(str(folder))


def examples() -> list[pathlib.Path]:
    """The example programs: `tilec/examples/` of an installed package (a link to the checkout's `examples/` in a
    source tree), sorted by name."""
    folder = importlib.resources.files("tilec") / "examples"
    if not folder.is_dir():  # a checkout on a system without symlinks: the folder at the top
        folder = pathlib.Path(__file__).resolve().parent.parent / "examples"
    found = sorted(pathlib.Path(str(folder)).glob("*.tl"))
    if not found:
        raise FileNotFoundError("tilec's examples are missing from this installation; reinstall tilec")
    return found
