"""tests/compiler state their expectations about generated kernels in the NKI 0.1 form (`nl.affine_range`,
`acc += nisa.nc_matmul`, ...), so they compile that form; the 0.6 form of the same IR is tested in tests/nki06."""
from __future__ import annotations

import pytest

from tilec.compiler import codegen


@pytest.fixture(autouse=True)
def _nki_01_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codegen, "DEFAULT_NKI", "0.1")
