"""`python -m tilec.nki kernel.py [args...]`: run a script whose kernels import neuronxcc, on tilec's interpreter."""
from __future__ import annotations

import runpy
import sys

from tilec.nki import shim


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m tilec.nki SCRIPT.py [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    shim.install()
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
