"""Auto-scheduling: search a program's schedule space, rank candidates with the performance model, verify the winner.

    knobs.py    the program's ops and default schedule (from the compiler's printed stages) -> a Space
    space.py    knobs, legal values, static checks; the one knob -> directive table (DIRECTIVES)
    experts.py  heuristic first guesses
    search.py   structured first guess, then evolutionary search; deterministic for a seed
    evaluate.py evaluators: the model (compile -> interpreter trace -> estimate), real hardware (nki.benchmark)
    hardware06.py  real hardware for NKI 0.6 kernels: NKI_ARTIFACTS_DIR + nrtpy benchmark(mode="device")
    bound.py    a lower bound on a candidate's model latency from its knob values: hopeless ones are pruned
    cache.py    outcomes on disk (.tilec-cache/tune/), so a re-run evaluates nothing
    verify.py   the winner against the reference evaluator
    api.py      tune() and its result; progress.py the progress line
"""

_API = ("tune", "TuneResult", "summary_text", "DEFAULT_BUDGET")


def __getattr__(name: str) -> object:
    """`tilec.tune.tune(...)` without importing the compiler for every submodule (worker processes start fast)."""
    if name in _API:
        from tilec.tune import api
        return getattr(api, name)
    raise AttributeError(f"module 'tilec.tune' has no attribute {name!r}")
