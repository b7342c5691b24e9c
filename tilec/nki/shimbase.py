"""What the two import shims (shim.py: `neuronxcc.nki`, NKI 0.1; shim06.py: `nki`, NKI 0.6) share: a loader whose
modules are marked as served by tilec, and the copy of an interpreter module's public names into a served module."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import types


class ShimLoader(importlib.abc.Loader):
    """Creates the served module marked `__tilec_shim__`, which is how `install(force=True)` and `active_backend`
    tell a served module from a real package's; subclasses fill it in `exec_module`."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__tilec_shim__ = True  # type: ignore[attr-defined]
        return module


def copy_public(module: types.ModuleType, src: types.ModuleType) -> None:
    """The API a kernel sees: `src`'s public names, without the modules it imports or its `annotations` future."""
    module.__dict__.update({k: v for k, v in vars(src).items()
                            if not k.startswith("_") and not isinstance(v, types.ModuleType) and k != "annotations"})
