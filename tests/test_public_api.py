"""`import tilec` re-exports the public API lazily: every advertised name resolves to a callable or a class."""
from __future__ import annotations

import tilec


def test_every_public_name_resolves() -> None:
    for name in tilec.__all__:
        assert callable(getattr(tilec, name)), name
    assert tilec.simulate_traced.__module__ == "tilec.nki.api"


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        tilec.no_such_thing
    except AttributeError as err:
        assert "no_such_thing" in str(err)
    else:
        raise AssertionError("tilec.no_such_thing resolved")
