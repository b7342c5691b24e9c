"""`python -m tilec.nki SCRIPT.py [ARGS...]`: run a script whose kernels import neuronxcc, on tilec's interpreter.

`python -m tilec.nki --install-pth` writes `tilec-nki.pth` into site-packages, so every Python start-up activates
the shim and plain `python kernel.py` works (needed for editable installs, which do not ship the .pth);
`--remove-pth` deletes it. The shim still steps aside when the real neuronxcc is installed.
"""
from __future__ import annotations

import pathlib
import runpy
import sys
import sysconfig

from tilec.nki import shim

PTH_NAME = "tilec-nki.pth"
# a .pth line runs at every start-up: do nothing (instead of failing) once tilec is uninstalled
PTH_TEXT = ('import importlib.util as _u; _u.find_spec("tilec") and '
            '__import__("tilec.nki.shim", fromlist=["install"]).install()\n')


def pth_path() -> pathlib.Path:
    return pathlib.Path(sysconfig.get_path("purelib")) / PTH_NAME


def main() -> None:
    args = sys.argv[1:]
    if args in (["--install-pth"], ["--remove-pth"]):
        path = pth_path()
        if args[0] == "--install-pth":
            path.write_text(PTH_TEXT)
            print(f"wrote {path}")
        elif path.exists():
            path.unlink()
            print(f"removed {path}")
        return
    if not args or args[0].startswith("-"):
        print("usage: python -m tilec.nki SCRIPT.py [ARGS...] | --install-pth | --remove-pth", file=sys.stderr)
        raise SystemExit(2)
    if not pathlib.Path(args[0]).is_file():  # as `python missing.py` says it, without a traceback
        print(f"python -m tilec.nki: can't open file {args[0]!r}: no such file", file=sys.stderr)
        raise SystemExit(2)
    shim.install()
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
