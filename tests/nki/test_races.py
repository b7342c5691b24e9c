"""The exact overlap test behind affine_range dependence detection, against brute-force element sets."""
from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tilec.nki import races

dims = st.lists(st.tuples(st.integers(1, 5), st.integers(0, 40)), min_size=1, max_size=3)


def elements(off: int, shape: tuple, strides: tuple) -> set[int]:
    return {off + sum(i * s for i, s in zip(idx, strides)) for idx in itertools.product(*map(range, shape))}


def record(off: int, pattern: list) -> tuple:
    shape, strides = tuple(n for n, _ in pattern), tuple(s for _, s in pattern)
    return (0, races.WRITE, off, shape, strides, ("k.py", 1))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(0, 200), st.integers(0, 200), dims, dims)
def test_common_element_matches_brute_force(off_a: int, off_b: int, pa: list, pb: list) -> None:
    ra, rb = record(off_a, pa), record(off_b, pb)
    truth = elements(*ra[2:5]) & elements(*rb[2:5])
    found = races._common_element(ra, rb)
    assert (found is not None) == bool(truth)
    if found is not None:
        assert found in truth


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(0, 300), dims)
def test_same_geometry_lattice_test(delta: int, pattern: list) -> None:
    """Equal shapes and strides take the O(depth) lattice path; it must agree with the element sets."""
    ra, rb = record(0, pattern), record(delta, pattern)
    truth = elements(*ra[2:5]) & elements(*rb[2:5])
    found = races._common_element(ra, rb)
    assert (found is not None) == bool(truth) and (found is None or found in truth)


class _Ref:
    name, memory, shape, scope = "t", "sbuf", (1000,), ()


class _Frame:
    where = ("k.py", 1)


accesses = st.lists(st.tuples(st.integers(0, 3), st.sampled_from([races.READ, races.WRITE, races.ACC]),
                              st.integers(0, 150), dims), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(accesses)
def test_sweep_finds_exactly_the_conflicting_iterations(accs: list) -> None:
    recs = [(it, kind, off, tuple(n for n, _ in p), tuple(s for _, s in p), ("k.py", 2)) for it, kind, off, p in accs]
    sets = [elements(*r[2:5]) for r in recs]
    expected = any(
        a[0] != b[0] and not (a[1] == b[1] == races.READ) and not (a[1] == b[1] == races.ACC) and sets[i] & sets[j]
        for (i, a), (j, b) in itertools.combinations(enumerate(recs), 2))
    try:
        races._check_buffer(recs, _Ref(), _Frame())
        raised = False
    except races.rules.LoopCarriedDependenceError:
        raised = True
    assert raised == expected
