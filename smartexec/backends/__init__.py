"""Backends: one module per way of running chunks.

``inline``, ``thread``, ``fork`` and ``loky`` ship with smartexec; others
plug in through the ``smartexec.backends`` entry-point group or
:func:`smartexec.register_backend`. All implement :class:`Backend`.
"""

from ._base import Backend

__all__ = ["Backend"]
