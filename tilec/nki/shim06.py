"""The `nki` import shim (NKI 0.6): serves `import nki`, `nki.isa`, `nki.language` from tilec's interpreter when AWS's
`nki` package is absent, as shim.py serves `neuronxcc.nki` (0.1). Both APIs run on one interpreter core.

The finder sits first in `sys.meta_path` but defers to a real `nki` package (a module with a file on sys.path), so an
installation of AWS's nki wins, while a directory that happens to be called `nki` (a namespace package, e.g. a tests
folder) does not hide the interpreter. `install(force=True)` (what `tilec nki-run` and TILEC_NKI=interp do) serves
the interpreter even where AWS's nki is installed.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

from tilec.nki.shimbase import ShimLoader, copy_public

_MODULES = {"nki": "tilec.nki.top06", "nki.isa": "tilec.nki.isa06", "nki.language": "tilec.nki.language06",
            "nki.typing": None}
_SUBMODULES = ("isa", "language", "typing")


class _Loader(ShimLoader):
    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        if _MODULES[name] is None:  # nki.typing: the tensor annotations, accepted and not enforced (as in 0.1)
            module.__dict__.update(vars(importlib.import_module("tilec.nki.top").typing))
            return
        src = importlib.import_module(_MODULES[name])
        copy_public(module, src)
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
    force = False  # serve the interpreter even where AWS's nki is installed

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        if fullname not in _MODULES:
            return None
        if fullname != "nki":  # nki.isa / nki.language: ours only under our nki
            parent = sys.modules.get("nki")
            if parent is None or not getattr(parent, "__tilec_shim__", False):
                return None
        elif not self.force:
            real = importlib.machinery.PathFinder.find_spec("nki")
            if real is not None and real.has_location:  # AWS's nki is installed: it wins
                return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=fullname == "nki")


_FINDER = NkiFinder()


def install(force: bool = False) -> None:
    """Make `import nki` work; idempotent. force=True serves the interpreter even where AWS's nki is installed."""
    if force and not _FINDER.force:
        _FINDER.force = True
        for name in [n for n in sys.modules if n == "nki" or n.startswith("nki.")]:
            if not getattr(sys.modules[name], "__tilec_shim__", False):
                del sys.modules[name]
    if not sys.meta_path or sys.meta_path[0] is not _FINDER:
        if _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
        sys.meta_path.insert(0, _FINDER)


def active_backend() -> str:
    """'nki' when AWS's package is what `import nki` gives, else 'tilec'."""
    install()
    mod = importlib.import_module("nki")
    return "tilec" if getattr(mod, "__tilec_shim__", False) else "nki"
