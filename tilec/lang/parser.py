"""Text -> syntax tree: the Lark parser for tilec/grammar/tilec.lark, a Transformer to the frozen records of
`tilec.lang.syntax`, and the translation of Lark's parse errors into TilecErrors with a caret and a hint.

The parser knows nothing of meaning: names, dtypes, indices and bounds are the checker's business.
"""
from __future__ import annotations

import functools
import math
import re
from typing import Iterator

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError
from lark.indenter import Indenter
from lark.lexer import PatternStr

from tilec.errors import Span, TilecError
from tilec.resources import resource_dir
from tilec.lang import syntax as s

GRAMMAR = resource_dir("grammar") / "tilec.lark"


# ---- indentation -----------------------------------------------------------------------------------------------------


class BlockIndenter(Indenter):
    """Turns indentation into _INDENT/_DEDENT tokens. Unlike Lark's stock Indenter it reports a bad dedent as a
    TilecError and leaves unbalanced brackets to the parser (which gives a better message)."""

    NL_type = "_NL"
    OPEN_PAREN_types = ["LPAR", "LSQB"]
    CLOSE_PAREN_types = ["RPAR", "RSQB"]
    INDENT_type = "_INDENT"
    DEDENT_type = "_DEDENT"
    tab_len = 8
    file = "<string>"
    source = ""

    def handle_NL(self, token: Token) -> Iterator[Token]:
        if self.paren_level > 0:
            return
        yield token
        indent_str = token.rsplit("\n", 1)[-1] if "\n" in token else ""
        indent = indent_str.count(" ") + indent_str.count("\t") * self.tab_len
        if indent > self.indent_level[-1]:
            self.indent_level.append(indent)
            yield Token.new_borrow_pos(self.INDENT_type, indent_str, token)
            return
        while indent < self.indent_level[-1]:
            self.indent_level.pop()
            yield Token.new_borrow_pos(self.DEDENT_type, indent_str, token)
        if indent != self.indent_level[-1]:
            raise self._bad_dedent(token, indent)

    def _bad_dedent(self, token: Token, indent: int) -> TilecError:
        line, col = token.end_line, token.end_column
        span = Span(self.file, line, col, line, col + 1, self.source)
        levels = ", ".join(str(n) for n in self.indent_level)
        return TilecError(f"this line is indented by {indent} columns, which matches no enclosing block", span,
                          f"indent it to one of the enclosing levels ({levels} columns)")

    def _process(self, stream: Iterator[Token]) -> Iterator[Token]:
        token = None
        self.open_brackets: list[Token] = []  # to blame an unclosed bracket, not the end of the file
        for token in stream:
            yield from (self.handle_NL(token) if token.type == self.NL_type else [token])
            if token.type in self.OPEN_PAREN_types:
                self.paren_level += 1
                self.open_brackets.append(token)
            elif token.type in self.CLOSE_PAREN_types:
                self.paren_level = max(0, self.paren_level - 1)
                self.open_brackets = self.open_brackets[:-1]
        while len(self.indent_level) > 1:
            self.indent_level.pop()
            yield Token.new_borrow_pos(self.DEDENT_type, "", token) if token else Token(self.DEDENT_type, "")


@functools.lru_cache(maxsize=None)
def _lark() -> Lark:
    return Lark(GRAMMAR.read_text(), parser="lalr", start=["start", "schedule_file"], propagate_positions=True,
                maybe_placeholders=False, postlex=BlockIndenter())


# ---- tree -> records ----------------------------------------------------------------------------------------------


class _Section(tuple):
    """A tagged group of kernel items (a `default`, `assume` or `let` line, or the schedule) on its way to Kernel."""

    kind = ""


def _section(kind: str, items: list) -> _Section:
    sec = _Section(items)
    sec.kind = kind
    return sec


@v_args(meta=True)
class ToSyntax(Transformer):
    """One method per grammar rule; each returns the syntax record for that rule, with its span."""

    def __init__(self, file: str, source: str) -> None:
        super().__init__()
        self.file, self.source = file, source

    def _span(self, meta) -> Span:
        return Span(self.file, meta.line, meta.column, meta.end_line, meta.end_column, self.source)

    def _tok_span(self, tok: Token) -> Span:
        return Span(self.file, tok.line, tok.column, tok.end_line, tok.end_column, self.source)

    # expressions
    def int(self, meta, ch):
        return s.Num(int(ch[0]), self._span(meta))

    def float(self, meta, ch):
        return s.Num(float(ch[0]), self._span(meta))

    def inf(self, meta, ch):
        return s.Num(math.inf, self._span(meta))

    def name(self, meta, ch):
        return s.Name(str(ch[0]), self._span(meta))

    def neg(self, meta, ch):
        # `-inf` and `-2` are literals: folding keeps parse -> fmt -> parse stable
        if isinstance(ch[0], s.Num):
            return s.Num(-ch[0].value, self._span(meta))
        return s.Neg(ch[0], self._span(meta))

    def _bin(self, op: str, meta, ch) -> s.BinOp:
        return s.BinOp(op, ch[0], ch[1], self._span(meta))

    def add(self, meta, ch):
        return self._bin("+", meta, ch)

    def sub(self, meta, ch):
        return self._bin("-", meta, ch)

    def mul(self, meta, ch):
        return self._bin("*", meta, ch)

    def div(self, meta, ch):
        return self._bin("/", meta, ch)

    def mod(self, meta, ch):
        return self._bin("%", meta, ch)

    def call(self, meta, ch):
        return s.Call(str(ch[0]), tuple(ch[1:]), self._span(meta))

    def access(self, meta, ch):
        return s.Access(str(ch[0]), tuple(ch[1:]), self._span(meta))

    def padded(self, meta, ch):
        return s.Access(ch[0].tensor, ch[0].indices, self._span(meta), fill=ch[1])

    def fill(self, meta, ch):
        # the grammar drops the anonymous "-" and "inf" tokens; the rule's own text is the number
        text = self.source.splitlines()[meta.line - 1][meta.column - 1:meta.end_column - 1].replace(" ", "")
        return float(text) if any(c in text for c in ".eEn") else int(text)

    def compare(self, meta, ch):
        return s.Compare(str(ch[1]), ch[0], ch[2], self._span(meta))

    # declarations
    def tensor_type(self, meta, ch):
        return s.TensorType(str(ch[0]), tuple(ch[1:]), self._span(meta))

    def param(self, meta, ch):
        return s.Param(str(ch[0]), ch[1], self._span(meta))

    def decl(self, meta, ch):
        return s.Decl(str(ch[0]), ch[1], self._span(meta))

    def size_binding(self, meta, ch):
        return s.Let(str(ch[0]), ch[1], self._span(meta))

    def default_line(self, meta, ch):
        return _section("default", ch)

    def let_line(self, meta, ch):
        return _section("let", ch)

    def assume_line(self, meta, ch):
        return _section("assume", [s.Assume(c, c.span) for c in ch])

    # statements
    def assign(self, meta, ch):
        return s.Assign(ch[0], str(ch[1]), ch[2], self._span(meta))

    def loop_range(self, meta, ch):
        return (str(ch[0]), ch[1], ch[2], self._span(meta))

    def loop(self, meta, ch):
        ranges = [c for c in ch if isinstance(c, tuple) and not isinstance(c, s.Loop | s.Assign)]
        body = tuple(c for c in ch if isinstance(c, s.Loop | s.Assign))
        for var, start, stop, span in reversed(ranges):  # `for a in .., b in ..:` nests b inside a
            body = (s.Loop(var, start, stop, body, span),)
        return body[0]

    # schedule
    def ref(self, meta, ch):
        return s.Ref(tuple(str(c) for c in ch), self._span(meta))

    def signed_int(self, meta, ch):
        return int(ch[-1]) * self._sign(meta)

    def _sign(self, meta) -> int:
        # the grammar drops the anonymous "-" token; the rule's own text says whether it was there
        text = self.source.splitlines()[meta.line - 1][meta.column - 1:]
        return -1 if text.startswith("-") else 1

    def key_arg(self, meta, ch):
        return s.KeyArg(str(ch[0]), ch[1], self._span(meta))

    def directive(self, meta, ch):
        return s.Directive(str(ch[0]), tuple(ch[1:]), self._span(meta))

    def schedule(self, meta, ch):
        return _section("schedule", ch)

    def schedule_file(self, meta, ch):
        return tuple(ch)

    # the kernel
    def kernel(self, meta, ch):
        name = ch[0]
        params = tuple(c for c in ch if isinstance(c, s.Param))
        outputs = [c for c in ch[1:] if isinstance(c, Token)]
        sections = {kind: [] for kind in ("default", "let", "assume", "schedule")}
        for c in ch:
            if isinstance(c, _Section):
                sections[c.kind].extend(c)
        return s.Kernel(
            name=str(name), params=params, outputs=tuple(str(o) for o in outputs),
            lets=tuple(sections["let"]), assumes=tuple(sections["assume"]),
            decls=tuple(c for c in ch if isinstance(c, s.Decl)),
            body=tuple(c for c in ch if isinstance(c, s.Loop | s.Assign)),
            schedule=tuple(sections["schedule"]), comments=leading_comments(self.source),
            span=self._span(meta), defaults=tuple(sections["default"]),
            output_spans=tuple(self._tok_span(o) for o in outputs))

    def start(self, meta, ch):
        return ch[-1]


def leading_comments(source: str) -> tuple[str, ...]:
    """The comment lines before the first line of code (the header comment fmt keeps)."""
    out = []
    for line in source.splitlines():
        text = line.strip()
        if text and not text.startswith("#"):
            break
        if text:
            out.append(text)
    return tuple(out)


# ---- entry points -------------------------------------------------------------------------------------------------


def parse(text: str, filename: str = "<string>") -> s.Kernel:
    """Parse one kernel; a syntax error is a TilecError pointing at the offending token."""
    return _run(text, filename, "start")


def parse_schedule(text: str, filename: str = "<string>") -> tuple[s.Directive, ...]:
    """Parse a schedule file: one directive a line, the same syntax as a kernel's `schedule:` section."""
    return _run(text, filename, "schedule_file")


def _run(text: str, filename: str, start: str):
    source = text if text.endswith("\n") else text + "\n"
    lark = _lark()
    indenter = lark.options.postlex
    indenter.file, indenter.source = filename, source
    try:
        tree = lark.parse(source, start=start)
    except UnexpectedInput as err:
        unclosed = getattr(indenter, "open_brackets", [])
        if unclosed and isinstance(err, (UnexpectedToken, UnexpectedEOF)) and _at_end(err):
            raise _unclosed(unclosed[-1], filename, source) from None
        raise syntax_error(err, filename, source, start) from None
    try:
        return ToSyntax(filename, source).transform(tree)
    except VisitError as err:
        raise err.orig_exc from None


# ---- syntax errors ------------------------------------------------------------------------------------------------

_WORDS = {
    "_NL": "end of line", "_INDENT": "an indented block", "_DEDENT": "the end of the block", "$END": "end of file",
    "NAME": "a name", "INT": "an integer", "FLOAT": "a number", "DTYPE": "a dtype (f32, f16, bf16)",
    "ASSIGN_OP": "`=`, `+=`, `max=` or `min=`", "COMPARE_OP": "a comparison (==, !=, <, <=, >, >=)",
}


def _describe(term: str) -> str:
    if term in _WORDS:
        return _WORDS[term]
    for t in _lark().terminals:
        if t.name == term and isinstance(t.pattern, PatternStr):
            return f"`{t.pattern.value}`"
    return term.lower()


def _found(tok: Token) -> str:
    words = {"_NL": "end of line", "_INDENT": "indentation", "_DEDENT": "end of the indented block",
             "$END": "end of file"}
    return words.get(tok.type, f"`{tok}`")


def syntax_error(err: UnexpectedInput, file: str, source: str, start: str) -> TilecError:
    """Lark's error -> TilecError: what was found, where, and what would have been accepted."""
    if isinstance(err, UnexpectedCharacters):
        span = Span(file, err.line, err.column, err.line, err.column + 1, source)
        char = source[err.pos_in_stream]
        return TilecError(f"unexpected character {char!r}", span, _char_hint(char))
    tok = err.token if isinstance(err, UnexpectedToken) else Token("$END", "")
    expected = sorted(getattr(err, "expected", None) or [])
    span = _token_span(tok, file, source)
    return TilecError(f"unexpected {_found(tok)}", span, _token_hint(tok, expected, start, source))


def _at_end(err: UnexpectedInput) -> bool:
    tok = getattr(err, "token", None)
    return tok is None or tok.type in ("$END", "_DEDENT")


def _unclosed(bracket: Token, file: str, source: str) -> TilecError:
    close = {"(": ")", "[": "]"}[str(bracket)]
    span = Span(file, bracket.line, bracket.column, bracket.line, bracket.column + 1, source)
    return TilecError(f"`{bracket}` is never closed", span, f"close it with `{close}`")


def _schedule_position(tok: Token, source: str) -> str:
    """Where the offending token is relative to a `schedule:` line: "header", "inside", "after" or ""."""
    lines = source.splitlines()
    if not tok.line or not 0 < tok.line <= len(lines):
        return ""
    here = lines[tok.line - 1]
    if here.strip().startswith("schedule:"):
        return "header"
    depth = len(here) - len(here.lstrip())
    for line in reversed(lines[:tok.line - 1]):
        if line.strip().startswith("schedule:"):
            return "inside" if depth > len(line) - len(line.lstrip()) else "after"
    return ""


def _token_span(tok: Token, file: str, source: str) -> Span:
    if tok.type in ("_INDENT", "_DEDENT") and tok.end_line is not None:
        return Span(file, tok.end_line, tok.end_column, tok.end_line, tok.end_column + 1, source)
    if tok.type == "$END" or tok.line is None:
        last = len(source.splitlines())
        return Span(file, last, 1, last, 2, source)
    if tok.type == "_NL":  # point just past the end of the line's text
        return Span(file, tok.line, tok.column, tok.line, tok.column + 1, source)
    return Span(file, tok.line, tok.column, tok.end_line, tok.end_column, source)


_CHAR_HINTS = {
    "^": "tilec has no power operator; write x * x",
    "{": "blocks are given by indentation, not braces: end the line with `:` and indent the body",
    "@": "write the matrix product as a loop: C[i, j] += A[i, k] * B[k, j]",
    ";": "put each statement on its own line",
    '"': "tilec has no strings",
    "'": "tilec has no strings",
}


def _char_hint(char: str) -> str:
    return _CHAR_HINTS.get(char, "tilec uses names, numbers, + - * / %, brackets and `#` comments")


def _token_hint(tok: Token, expected: list[str], start: str, source: str) -> str:
    special = _special_hint(tok, set(expected), start, source)
    shown = [_describe(t) for t in expected]
    if special and (len(shown) > 4 or special.startswith("the `schedule:`")):
        return special
    tail = f"expected {', '.join(shown)}" if shown else ""
    return f"{special}; {tail}" if special and tail else special or tail


def _special_hint(tok: Token, expected: set[str], start: str, source: str) -> str:
    where = _schedule_position(tok, source)
    if where in ("header", "after"):
        return "the `schedule:` section comes last in the kernel, after the statements"
    if where == "inside" or start == "schedule_file":
        return "a directive is `NAME arg, arg, ...`; an arg is a name (`conv`, `conv.y`), an integer or key=value"
    if tok.type == "_INDENT":        return "only the body of a `for` line or of `schedule:` is indented further"
    if "_INDENT" in expected:
        return "indent the body of the block below the line ending in `:`"
    if "COLON" in expected and tok.type == "_NL":
        return "a `for` line ends with `:`"
    if "DTYPE" in expected:
        return "a tensor type is f32[...], f16[...] or bf16[...]"
    if "ASSIGN_OP" in expected:
        return "a statement is `TENSOR[indices] = expression` (or +=, max=, min=)"
    if str(tok) == "??" and not _after(tok, source, r"\]\s*$"):
        return "`??` pads a tensor read `X[...]`, not an expression: pad the read inside, e.g. `relu(X[i - 1] ?? 0)`"
    if str(tok) == "??":
        return "a padded read `X[i] ?? 0` is a whole expression: put it in parentheses, e.g. `2 * (X[i] ?? 0)`"
    if _after(tok, source, r"\?\?\s*$"):
        return "a padded read ends in its padding constant: a number, `-inf` or `inf`, e.g. `X[i - 1] ?? 0`"
    if _after(tok, source, r"\?\?\s*-?\s*(inf|[0-9][0-9.eE+-]*)\s*$"):
        return "a padded read `X[i] ?? 0` is a whole expression: put it in parentheses, e.g. `(X[i] ?? 0) * W[i]`"
    if "RSQB" in expected and tok.type in ("_NL", "RPAR"):
        return "close the index list with `]`"
    if "RPAR" in expected and tok.type in ("_NL", "RSQB"):
        return "close the parenthesis with `)`"
    if any(_describe(t) == "`->`" for t in expected):
        return "a kernel header is `kernel NAME(PARAM: f32[N, ...], ...) -> OUTPUT, ...`"
    if tok.type == "$END" and start == "start":
        return "a .tl file holds one `kernel NAME(params) -> outputs` with an indented body"
    return ""


def _after(tok: Token, source: str, pattern: str) -> bool:
    """The text before the token on its line ends with `pattern` (e.g. `?? 0`: an operator after a padded read)."""
    lines = source.splitlines()
    if tok.type in ("$END", "_INDENT", "_DEDENT") or not tok.line or not 0 < tok.line <= len(lines):
        return False
    before = lines[tok.line - 1][:tok.column - 1]
    return re.search(pattern, before) is not None
