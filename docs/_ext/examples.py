"""A griffe extension for the API reference: the library's docstrings head their doctests
``Example:`` (Google style allows it); griffe's Google parser knows ``Examples:`` only, and
would render the ``>>>`` lines as Markdown block quotes."""

from __future__ import annotations

import re

import griffe

HEADING = re.compile(r"^(\s*)Example:$", re.M)


class ExampleSections(griffe.Extension):
    """Reads each docstring's ``Example:`` heading as ``Examples:``."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = HEADING.sub(r"\1Examples:", obj.docstring.value)
