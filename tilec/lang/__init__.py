"""The tilec language: text -> checked program -> reference results.

    tilec/grammar/tilec.lark  the surface syntax (the language reference)
    parser.py           Lark parser -> syntax.py records with spans; syntax errors with carets
    checker.py          names, declarations, arity, quasi-affine indices, dtypes, data flow
    symbolic.py         polynomials over sizes, affine index forms
    bounds.py           bounds (through floor division; padded reads' halo): proven symbolically, else checked
                        with concrete sizes
    evaluator.py        the NumPy reference evaluator (plan.py: which loops run vectorised; contract.py: matmuls)
    fmt.py              canonical formatting
    api.py              the public API: parse, load, bind_inputs, random_inputs, evaluate

Nothing here imports the compiler, the NKI interpreter or the performance model.
"""
