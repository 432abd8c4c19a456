"""One-token defects: where they can be planted in a source file, and how a file looks with one.

Pure functions over source text. The kinds are the ones the repair marathon plants: a comparison
turned round, plus for minus (and back), ``and`` for ``or`` (and back), and a dropped ``not``.
Only code inside a public function or class (a name in the module's ``__all__``) is a candidate,
so every defect belongs to something the test suite exercises by name.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass

_TURNED_ROUND = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}
_PLUS_MINUS = {"+": "-", "-": "+", "+=": "-=", "-=": "+="}
_AND_OR = {"and": "or", "or": "and"}
_OPERAND_END = {tokenize.NAME, tokenize.NUMBER, tokenize.STRING}


@dataclass(frozen=True, slots=True)
class Defect:
    """One token changed at one place: ``old`` at ``line``/``col`` of ``path`` becomes ``new``."""

    path: str
    """The file, relative to the project root, e.g. ``more_itertools/more.py``."""
    line: int
    """1-based."""
    col: int
    old: str
    new: str
    kind: str
    """``comparison``, ``plus_minus``, ``and_or`` or ``dropped_not``."""
    function: str
    """The public function or class the defect sits in."""

    @property
    def key(self) -> str:
        return f"{self.path}:{self.line}:{self.col}:{self.old}->{self.new}"

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "old": self.old,
            "new": self.new,
            "kind": self.kind,
            "function": self.function,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Defect:
        return cls(
            path=str(data["path"]),
            line=int(str(data["line"])),
            col=int(str(data["col"])),
            old=str(data["old"]),
            new=str(data["new"]),
            kind=str(data["kind"]),
            function=str(data["function"]),
        )


def public_spans(source: str) -> list[tuple[str, int, int]]:
    """``(name, first line, last line)`` of every top-level def/class listed in ``__all__``."""
    tree = ast.parse(source)
    exported: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            value = ast.literal_eval(node.value)
            exported.update(str(name) for name in value)
    spans = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in exported:
            spans.append((node.name, node.lineno, node.end_lineno or node.lineno))
    return spans


def _docstring_lines(source: str) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef | ast.Module):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                first = body[0]
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def candidate_defects(path: str, source: str) -> list[Defect]:
    """Every place in ``source`` where one defect of a known kind can be planted, in file order."""
    spans = public_spans(source)
    skip = _docstring_lines(source)

    def owner(line: int) -> str | None:
        for name, first, last in spans:
            if first <= line <= last:
                return name
        return None

    found: list[Defect] = []
    previous: tokenize.TokenInfo | None = None
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for index, token in enumerate(tokens):
        line, col = token.start
        name = owner(line)
        significant = token.type not in {tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT}
        if name is not None and line not in skip:
            replacement = _replacement(token, previous, tokens[index + 1 : index + 2])
            if replacement is not None:
                new, kind = replacement
                found.append(Defect(path, line, col, token.string, new, kind, name))
        if significant:
            previous = token
    return found


def _replacement(
    token: tokenize.TokenInfo,
    previous: tokenize.TokenInfo | None,
    following: list[tokenize.TokenInfo],
) -> tuple[str, str] | None:
    text = token.string
    if token.type == tokenize.OP and text in _TURNED_ROUND:
        return _TURNED_ROUND[text], "comparison"
    if token.type == tokenize.OP and text in _PLUS_MINUS:
        binary = previous is not None and (
            previous.type in _OPERAND_END or previous.string in {")", "]"}
        )
        if binary and (previous is None or previous.string not in {"lambda", "return", "in"}):
            return _PLUS_MINUS[text], "plus_minus"
        return None
    if token.type == tokenize.NAME and text in _AND_OR:
        return _AND_OR[text], "and_or"
    if token.type == tokenize.NAME and text == "not":
        after = following[0].string if following else ""
        if after != "in" and (previous is None or previous.string != "is"):
            return "", "dropped_not"
    return None


def plant(source: str, defect: Defect) -> str:
    """``source`` with ``defect`` planted; raises ``ValueError`` if the token is not where it says."""
    lines = source.splitlines(keepends=True)
    text = lines[defect.line - 1]
    if text[defect.col : defect.col + len(defect.old)] != defect.old:
        raise ValueError(f"{defect.key}: {defect.old!r} is not at that place")
    end = defect.col + len(defect.old)
    if defect.kind == "dropped_not":
        while end < len(text) and text[end] == " ":
            end += 1  # "not x" -> "x"
    lines[defect.line - 1] = text[: defect.col] + defect.new + text[end:]
    planted = "".join(lines)
    ast.parse(planted)  # every defect leaves valid Python
    return planted


def describe(defect: Defect) -> str:
    """What was wrong, in the words a fix log would use."""
    if defect.kind == "dropped_not":
        return "a `not` was missing"
    return f"`{defect.new}` where `{defect.old}` belongs"
