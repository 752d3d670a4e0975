"""The profile store's files, in a directory another user might write to: read, listed and removed without following links or trusting another's file."""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path

LOGGER = logging.getLogger("smartexec._profiles")  # the store's messages, under one name

__all__ = ["MAX_FILE_BYTES", "refusal"]


#: The most bytes a profile file may hold: a bigger one is ignored (a profile is ~1 KiB).
MAX_FILE_BYTES = 64 * 1024

_NAME = re.compile(r"^[0-9a-f]{64}\.json$")

#: The store's token in the names of its temporary files: other ``.tmp-*`` files are not its.
_TMP_PREFIX = ".tmp-smartexec-"

_TMP_NAME = re.compile(r"^\.tmp-smartexec-[0-9a-f]{16}\.json$")

_O_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)

_O_NONBLOCK: int = getattr(os, "O_NONBLOCK", 0)

_O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)

_O_DIRECTORY: int = getattr(os, "O_DIRECTORY", 0)

_READ_FLAGS = os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC

_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC

_DIR_FLAGS = os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC


def _untrusted_dir(st: os.stat_result) -> str | None:
    """Why the store does not trust a directory with this ``stat``, or None when it does."""
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _not_own_file(st: os.stat_result) -> str | None:
    """Why a file with this ``stat`` is not one the store may have made, or None."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}"
    return None


def refusal(directory: Path) -> str | None:
    """Return why the store will not use ``directory``, or None when it would.

    The store uses a directory that belongs to this user (:func:`os.geteuid`)
    and that group and others cannot write; one that does not exist yet is
    made so at the first save. Never raises.

    Args:
        directory: a directory, usually :func:`smartexec._profiles.cache_dir`'s.

    Returns:
        A phrase such as ``"owned by uid 1001, not by this user (uid 1000)"``
        or ``"writable by group or others (mode 777)"``; None when the store
        would use it or it does not exist yet.
    """
    try:
        return _untrusted_dir(os.stat(directory))
    except FileNotFoundError:
        return None
    except Exception as exc:
        return f"cannot use it: {exc}"


def _read(dir_fd: int, name: str) -> bytes | None:
    """The bytes of the file ``name`` in ``dir_fd``, or None when the store may not trust it.

    Only a regular file (the open neither follows a symlink nor waits on a
    FIFO), of this user, not writable by group or others and of at most
    :data:`MAX_FILE_BYTES` is read; None when it is absent or anything else.
    """
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        why = _not_own_file(st)
        if why is None and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            why = "writable by group or others"
        if why is None and st.st_size > MAX_FILE_BYTES:
            why = f"{st.st_size} bytes"
        chunks: list[bytes] = []
        size = 0
        while why is None:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_FILE_BYTES:
                why = f"over {MAX_FILE_BYTES} bytes"
    finally:
        os.close(fd)
    LOGGER.debug("smartexec: ignoring %s in the profile store: %s", name, why)
    return None


def _store_files(dir_fd: int) -> list[tuple[str, str, os.stat_result]]:
    """The files of ``dir_fd`` whose name and ``stat`` say the store may have made them.

    Each as (kind, name, stat): kind ``"profile"`` (its content is still to
    be checked: :func:`smartexec._profiles._is_own`) or ``"tmp"`` (a temporary file with the
    store's token). Regular files of this user only; a symlink is not one.
    """
    found = []
    with os.scandir(dir_fd) as it:
        for entry in it:
            name = entry.name
            if _NAME.match(name):
                kind = "profile"
            elif _TMP_NAME.match(name):
                kind = "tmp"
            else:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if _not_own_file(st) is None:
                found.append((kind, name, st))
    return found


def _unlink(name: str, dir_fd: int) -> bool:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        return False
    return True
