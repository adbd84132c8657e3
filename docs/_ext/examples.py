"""A griffe extension for the API reference: it reads the library's docstrings as Markdown.

They head their doctests ``Example:`` (Google style allows it), which griffe's Google
parser knows as ``Examples:`` only (else the ``>>>`` lines render as block quotes); and
they name other objects with Sphinx roles (``:func:`trainable```), shown here as code."""

from __future__ import annotations

import re

import griffe

HEADING = re.compile(r"^(\s*)Example:$", re.M)
ROLE = re.compile(r":(?:func|class|meth|data|attr|mod|exc):`(~?)([^`]+)`")


def code(role: re.Match) -> str:
    """A role as code: ``~a.b.c`` shows ``c``, as Sphinx does."""
    tilde, target = role.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class Docstrings(griffe.Extension):
    """Reads each docstring's ``Example:`` heading as ``Examples:``, and roles as code."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            text = HEADING.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = ROLE.sub(code, text)
