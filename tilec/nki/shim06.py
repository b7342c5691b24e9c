"""The `nki` import shim (NKI 0.6): serves `import nki`, `nki.isa`, `nki.language` from tilec's interpreter when AWS's
`nki` package is absent, as shim.py serves `neuronxcc.nki` (0.1). Both APIs run on one interpreter core.

The finder is appended to the end of `sys.meta_path`, so a real `nki` installation is found first and wins;
`install(force=True)` (what `tilec nki-run` and TILEC_NKI=interp do) puts it first.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

_MODULES = {"nki": "tilec.nki.top06", "nki.isa": "tilec.nki.isa06", "nki.language": "tilec.nki.language06"}
_SUBMODULES = ("isa", "language")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__tilec_shim__ = True
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        src = importlib.import_module(_MODULES[name])
        module.__dict__.update({k: v for k, v in vars(src).items()
                                if not k.startswith("_") and not isinstance(v, types.ModuleType)
                                and k != "annotations"})
        if name == "nki":
            module.__path__ = []
            module.__getattr__ = src.missing
            for k in ("Run06", "Kernel06", "check_capacity", "missing"):
                module.__dict__.pop(k, None)  # interpreter internals, not part of the nki API
            module.Kernel = src.Kernel06
            sys.modules[name] = module  # so the submodule imports below find their parent
            for sub in _SUBMODULES:
                setattr(module, sub, importlib.import_module(f"{name}.{sub}"))
        elif name == "nki.language":
            module.__getattr__ = getattr(src, "__getattr__")


class NkiFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None):
        if fullname not in _MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=fullname == "nki")


_FINDER = NkiFinder()


def install(force: bool = False) -> None:
    """Make `import nki` work; idempotent. force=True serves the interpreter even where AWS's nki is installed."""
    if _FINDER in sys.meta_path:
        if not force or sys.meta_path[0] is _FINDER:
            return
        sys.meta_path.remove(_FINDER)
    if force:
        for name in [n for n in sys.modules if n == "nki" or n.startswith("nki.")]:
            if not getattr(sys.modules[name], "__tilec_shim__", False):
                del sys.modules[name]
        sys.meta_path.insert(0, _FINDER)
    else:
        sys.meta_path.append(_FINDER)


def active_backend() -> str:
    """'nki' when AWS's package is what `import nki` gives, else 'tilec'."""
    install()
    mod = importlib.import_module("nki")
    return "tilec" if getattr(mod, "__tilec_shim__", False) else "nki"
