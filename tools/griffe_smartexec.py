"""Griffe extension for smartexec's API reference (mkdocs.yml loads it).

Two things static analysis alone gets wrong in smartexec's docstrings:

* **Sphinx roles.** The docstrings follow CPython's style, with
  ``:class:`~pkg.mod.Name``` roles that Markdown would show verbatim. Each
  role becomes inline code: ``~pkg.mod.Name`` gives ``Name``, any other
  target keeps its full dotted path.
* **Docstrings assigned at run time.** Methods that override the stdlib reuse
  its docstring and append "smartexec adds: ..." (``map.__doc__ = ...`` in
  ``executor.py``, as STYLE.md asks); griffe cannot evaluate that, so a
  function with no static docstring takes its ``__doc__`` from the imported
  object.

Only the rendered site changes; the docstrings stay as they are for
``help()`` and IDEs.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

import griffe

#: As docstring_options in mkdocs.yml.
_PARSER_OPTIONS: dict[str, Any] = {"returns_multiple_items": False}

_ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj):`(~?)([^`]+)`")


def _plain(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    if short:
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def _runtime_doc(path: str) -> str | None:
    """The ``__doc__`` of the object at dotted ``path``, imported; None if none."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for name in parts[split:]:
                target = getattr(target, name)
        except AttributeError:
            return None
        doc = getattr(target, "__doc__", None)
        return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else None
    return None


class SmartexecDocstrings(griffe.Extension):
    """Fill run-time docstrings, then rewrite Sphinx roles, for every object."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None and obj.is_function and obj.path.startswith("smartexec."):
            doc = _runtime_doc(obj.path)
            if doc is not None:
                obj.docstring = griffe.Docstring(
                    doc, parent=obj, parser="google", parser_options=_PARSER_OPTIONS
                )
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_plain, obj.docstring.value)
