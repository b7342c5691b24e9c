"""`import tilec` re-exports the public API lazily: every advertised name resolves, whatever was imported before."""
from __future__ import annotations

import subprocess
import sys
import types

import tilec


def test_every_public_name_resolves() -> None:
    for name in tilec.__all__:
        value = getattr(tilec, name)
        assert callable(value) or isinstance(value, types.ModuleType), name
    assert tilec.simulate_traced.__module__ == "tilec.nki.api"
    assert tilec.tune.tune.__module__ == "tilec.tune.api"


def test_the_tuner_is_reached_the_same_way_in_a_fresh_process() -> None:
    # before and after `import tilec.tune.api` (which binds the package as tilec.tune): one meaning
    code = ("import tilec; a = tilec.tune.tune; import tilec.tune.api; b = tilec.tune.tune; "
            "assert a is b and isinstance(tilec.tune, type(tilec)); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        tilec.no_such_thing
    except AttributeError as err:
        assert "no_such_thing" in str(err)
    else:
        raise AssertionError("tilec.no_such_thing resolved")
