"""Regenerate `generated/`: the NKI kernel of every example at its default (the assignment's) shapes, in both forms.

    generated/NAME.py         NKI 0.1 (`import neuronxcc.nki`: Neuron SDK <= 2.29, the course environment)
    generated/nki06/NAME.py   NKI 0.6 (`import nki`: Neuron SDK 2.29+, the default form)

    python -m tilec.compiler.regen            rewrite both
    python -m tilec.compiler.regen --check    exit 1 and list the stale files instead
"""
from __future__ import annotations

import pathlib
import sys

from tilec.compiler.api import compile_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = {"0.1": ROOT / "generated", "0.6": ROOT / "generated" / "nki06"}  # NKI version -> where its kernels live


def expected() -> dict[pathlib.Path, str]:
    out = {}
    for tl in sorted((ROOT / "examples").glob("*.tl")):
        for nki, folder in FOLDERS.items():
            out[folder / f"{tl.stem}.py"] = compile_file(str(tl), nki=nki).source
    return out


def stale() -> list[pathlib.Path]:
    return [p for p, text in expected().items() if not p.exists() or p.read_text() != text]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        bad = stale()
        for p in bad:
            print(f"stale: {p.relative_to(ROOT)}")
        return 1 if bad else 0
    for path, text in expected().items():
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
