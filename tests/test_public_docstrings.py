"""The public API (what ``keeper_middleware`` exports) documents its arguments.

A function, or a class with a hand-written ``__init__``, has an ``Args:`` section in its (or its
``__init__``'s) docstring that names every parameter. A dataclass documents each field where it
is declared (a docstring under the field, as LangChain's middleware does), or in an ``Args:``
section. Exceptions, protocols and typed dicts are not called by users and are left out.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import textwrap
import typing

import pytest

import keeper_middleware

PENDING: set[str] = set()
"""Names whose docstrings are still to be written (none)."""


def _public_callables() -> list[tuple[str, object]]:
    found = []
    for name in keeper_middleware.__all__:
        obj = getattr(keeper_middleware, name)
        if isinstance(obj, type) and (
            issubclass(obj, BaseException)
            or getattr(obj, "_is_protocol", False)
            or typing.is_typeddict(obj)
        ):
            continue
        if not callable(obj):
            continue
        parameters = [p for p in inspect.signature(obj).parameters if p != "self"]
        if parameters:
            found.append((name, obj))
    return found


def _args_section(doc: str) -> str | None:
    if "Args:" not in doc:
        return None
    section = doc.split("Args:", 1)[1]
    for end in ("Returns:", "Raises:", "Yields:", "Example", "\n\n\n"):
        section = section.split(end, 1)[0]
    return section


def _field_docs(cls: type) -> set[str]:
    """The fields of a dataclass that have a docstring under their declaration."""
    documented: set[str] = set()
    for klass in cls.__mro__:
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        assert isinstance(body, ast.ClassDef)
        statements = body.body
        for statement, after in itertools.pairwise(statements):
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                documented.add(statement.target.id)
    return documented


def _undocumented(obj: object) -> list[str]:
    parameters = [
        p.name
        for p in inspect.signature(obj).parameters.values()  # type: ignore[arg-type]
        if p.name != "self" and p.kind is not inspect.Parameter.VAR_POSITIONAL
    ]
    docs = [inspect.getdoc(obj) or ""]
    if isinstance(obj, type) and "__init__" in vars(obj):
        docs.append(inspect.getdoc(vars(obj)["__init__"]) or "")
    sections = [s for s in (_args_section(d) for d in docs) if s is not None]
    described = set()
    for section in sections:
        described |= {p for p in parameters if f"{p}:" in section or f"**{p}:" in section}
    if isinstance(obj, type) and dataclasses.is_dataclass(obj):
        described |= _field_docs(obj)
    return [p for p in parameters if p not in described]


CHECKED = [(n, o) for n, o in _public_callables() if n not in PENDING]


@pytest.mark.parametrize(("name", "obj"), CHECKED, ids=[n for n, _ in CHECKED])
def test_every_argument_of_the_public_api_is_documented(name, obj):
    assert _undocumented(obj) == [], f"{name}: no Args entry or field docstring for these"


def test_the_pending_names_are_still_public():
    """A name leaves ``PENDING`` when it is documented; none may linger after it is gone."""
    assert set(keeper_middleware.__all__) >= PENDING


def test_the_check_sees_a_missing_argument():
    def documented(a: int, b: int) -> None:
        """Do it.

        Args:
            a: the first.
        """

    assert _undocumented(documented) == ["b"]
