"""Docstrings in the package are written for ``help()`` and editors, in the
reStructuredText habits of the standard library (``code``, :class:`Name`,
``Example::`` blocks, simple tables). The API reference renders Markdown, so
this griffe extension turns those few constructs into their Markdown form
when mkdocstrings loads the package. The package itself is unchanged.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import griffe

#: :class:`Name`, :meth:`~asynclock.Lock.acquire`, … → `Name`, `acquire`
ROLE = re.compile(r":(?:class|func|meth|exc|attr|mod|data|obj):`~?([^`]+)`")
#: the border line of a simple table: ====  =====
TABLE_BORDER = re.compile(r"^\s*=+(\s+=+)+\s*$")


def markdown(text: str) -> str:
    """``text`` (a docstring) with its reStructuredText constructs in Markdown."""
    text = ROLE.sub(lambda match: f"``{match.group(1)}``", text)
    lines = text.splitlines()
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if TABLE_BORDER.match(line):
            # a simple table: shown as it is written, in a text block
            block = [line]
            index += 1
            borders = 1
            while index < len(lines) and borders < 2:
                block.append(lines[index])
                borders += bool(TABLE_BORDER.match(lines[index]))
                index += 1
            out += ["```text", *textwrap.dedent("\n".join(block)).splitlines(), "```"]
            continue
        if line.rstrip().endswith("::") and not line.strip().startswith(".."):
            # a literal block: the indented lines after it, as Python
            intro = line.rstrip()[:-1]
            out.append(intro if intro.strip() else "")
            index += 1
            block = []
            while index < len(lines) and (not lines[index].strip() or lines[index].startswith((" ", "\t"))):
                block.append(lines[index])
                index += 1
            while block and not block[-1].strip():
                block.pop()
            out += ["", "```python", *textwrap.dedent("\n".join(block)).strip("\n").splitlines(), "```", ""]
            continue
        out.append(line)
        index += 1
    return "\n".join(out)


class ReStructuredTextToMarkdown(griffe.Extension):
    """Rewrites every docstring of the loaded package (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
