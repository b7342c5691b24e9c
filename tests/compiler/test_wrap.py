"""Long lines of generated kernels: wrapped within LINE_MAX without changing the program or its `# tl:N` tags."""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

from tilec.compiler import codegen
from tilec.compiler.api import compile_file
from tilec.compiler.wrap import LINE_MAX, unwrap, wrap_line, wrap_text

ROOT = Path(__file__).resolve().parents[2]
GENERATED = sorted((ROOT / "generated").glob("*.py")) + sorted((ROOT / "generated" / "nki06").glob("*.py"))
TAG = re.compile(r"#.*\btl:(\d+)")


@pytest.mark.parametrize("path", GENERATED, ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_lines_fit(path: Path) -> None:
    long = [line for line in path.read_text().splitlines() if len(line) > LINE_MAX]
    assert not long, long


def _tags_by_statement(text: str) -> list[tuple[str, str | None]]:
    """(statement, the tag on its first line) for every statement of the kernel, in order."""
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.stmt):
            m = TAG.search(lines[node.lineno - 1])
            out.append((ast.dump(node), m.group(1) if m else None))
    return out


@pytest.mark.parametrize("example", ["conv2d", "conv_bias_maxpool", "mobilenet_block", "avgpool", "layernorm"])
@pytest.mark.parametrize("nki", ["0.1", "0.6"])
def test_wrapping_keeps_program_and_tags(example: str, nki: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = ROOT / "examples" / f"{example}.tl"
    wrapped = compile_file(path, nki=nki).source
    monkeypatch.setattr(codegen, "wrap_text", lambda text: text)
    plain = compile_file(path, nki=nki).source
    assert max(len(line) for line in plain.splitlines()) > LINE_MAX  # there was something to wrap
    assert wrapped != plain
    assert ast.dump(ast.parse(wrapped)) == ast.dump(ast.parse(plain))
    assert _tags_by_statement(wrapped) == _tags_by_statement(plain)
    assert _code_lines(unwrap(wrapped)) == _code_lines(plain)  # a statement per line again, tag at its end


def _code_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.lstrip().startswith(("assert ", "#"))]


def test_call_aligned_with_its_first_argument() -> None:
    line = ("        Y_cols[:, 14:32] = nisa.tensor_tensor(X_band[:, 14:32, 1:64:2], X_band[:, 14:32, 0:63:2], "
            "op=nl.add, engine=nisa.gpsimd_engine, dtype=nl.float32)  # tl:8")
    assert wrap_line(line) == [
        "        Y_cols[:, 14:32] = nisa.tensor_tensor(X_band[:, 14:32, 1:64:2], X_band[:, 14:32, 0:63:2], op=nl.add,"
        "  # tl:8",
        "                                              engine=nisa.gpsimd_engine, dtype=nl.float32)"]


def test_call_with_hanging_arguments_when_aligned_ones_do_not_fit() -> None:
    line = (" " * 32 + "Y_acc += nisa.nc_matmul(Wt_T[:, c_t, r, s, k_t * TILE_K:k_t * TILE_K + TILE_K], "
            "X_band[:, c_t, y_g * ROWS + r:y_g * ROWS + r + ROWS, s:s + TILE_X])  # tl:12")
    assert wrap_line(line) == [
        " " * 32 + "Y_acc += nisa.nc_matmul(  # tl:12",
        " " * 40 + "Wt_T[:, c_t, r, s, k_t * TILE_K:k_t * TILE_K + TILE_K],",
        " " * 40 + "X_band[:, c_t, y_g * ROWS + r:y_g * ROWS + r + ROWS, s:s + TILE_X])"]


def test_message_split_after_a_clause() -> None:
    line = ("    assert X.shape == (4, 256, 224, 224), 'k was compiled for X of shape (4, 256, 224, 224), a long "
            "kernel name; recompile with tilec compile -D N=... -D C=... -D H=... -D W=...'")
    out = wrap_line(line)
    assert out == ["    assert X.shape == (4, 256, 224, 224), ('k was compiled for X of shape (4, 256, 224, 224), "
                   "a long kernel name; '",
                   " " * 43 + "'recompile with tilec compile -D N=... -D C=... -D H=... -D W=...')"]
    assert ast.dump(ast.parse(textwrap.dedent("\n".join(out)))) == ast.dump(ast.parse(line.strip()))


def test_comment_filled_and_short_lines_kept() -> None:
    comment = "    # ---- " + " ".join(["word"] * 40)
    out = wrap_line(comment)
    assert len(out) == 2 and all(len(line) <= LINE_MAX for line in out)
    assert out[1].startswith("    #      word")
    assert wrap_line("    x = f(a, b)  # tl:1") == ["    x = f(a, b)  # tl:1"]
    unbreakable = "    x = " + "a" * 130
    assert wrap_line(unbreakable) == [unbreakable]


def test_docstring_left_as_written() -> None:
    text = '"""' + "doc(" + ", ".join(["x"] * 60) + ')"""\ndef k():\n    return 1\n'
    assert wrap_text(text) == text
