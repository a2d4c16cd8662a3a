"""Where a file the package writes really goes: the process umask, and which symlinks it follows.

The package writes its caches as a temporary file renamed over the target name (a reader never sees
half a file). A rename replaces a symlink rather than writing through it, so a link the user typed
is resolved first, to write the file it names and keep the link. That resolution must not undo the
kernel's ``protected_symlinks`` rule: in a sticky world-writable folder (``/tmp``) a link owned by
someone other than the caller and the folder's owner is not followed by ``open``; it is not followed
here either (a link another user plants in ``/tmp`` could otherwise make the caller replace any file
it can write).
"""

from __future__ import annotations

import errno
import os
import stat

MAX_LINKS = 40  # as the kernel's ELOOP limit


def current_umask() -> int:
    """The process umask, read without changing it where /proc allows (os.umask is set-and-return)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _protected(link: str) -> bool:
    """True when the kernel would refuse to follow ``link`` for this process (``protected_symlinks``)."""
    if not hasattr(os, "geteuid"):  # no such rule outside POSIX
        return False
    folder = os.stat(os.path.dirname(os.path.abspath(link)))
    shared = folder.st_mode & stat.S_ISVTX and folder.st_mode & stat.S_IWOTH
    owner = os.lstat(link).st_uid
    return bool(shared) and owner != os.geteuid() and owner != folder.st_uid


def link_target(path) -> str:
    """The file a write to ``path`` should replace: ``path`` itself, or, when it is a symlink the caller
    may follow, the file the chain of links names (``os.path.realpath``).

    Raises:
        PermissionError: a link in the chain is owned by another user in a sticky world-writable folder
            (the kernel's ``protected_symlinks`` rule; nothing is written).
        OSError: ``ELOOP`` for more than 40 links.
    """
    path = os.fspath(path)
    current = path
    for _ in range(MAX_LINKS):
        if not os.path.islink(current):
            return path if current == path else os.path.realpath(path)
        if _protected(current):
            raise PermissionError(
                errno.EACCES,
                "a symbolic link owned by another user in a shared sticky folder: not followed "
                "(the kernel's protected_symlinks rule); remove it or write elsewhere",
                current,
            )
        current = os.path.join(os.path.dirname(current), os.readlink(current))
    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
