"""Where tilec's non-Python files live: `grammar/` and `templates/` at the top of a source checkout (editable
install), or under `<prefix>/share/tilec/` for a regular install (pyproject's data-files)."""
from __future__ import annotations

import pathlib
import sys

_CHECKOUT = pathlib.Path(__file__).resolve().parent.parent


def resource_dir(name: str) -> pathlib.Path:
    """The folder `grammar` or `templates`, wherever this installation keeps it."""
    for base in (_CHECKOUT, pathlib.Path(sys.prefix) / "share" / "tilec"):
        if (base / name).is_dir():
            return base / name
    raise FileNotFoundError(f"tilec's {name}/ folder is missing from this installation; reinstall tilec")
