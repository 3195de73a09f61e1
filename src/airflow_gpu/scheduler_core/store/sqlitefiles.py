"""Before a command opens a SQLite database: its file and the WAL files beside it (`-wal`,
`-shm`) must be writable. SQLite maps `-shm` into memory and writes it even to read; an
immutable one (`chattr +i`) makes a new connection fail, and the server's open mapping
die with SIGBUS (no Python error, no log line) at its next write. Checked at start-up
so that the command fails in one line naming the file and the fix instead."""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path

from ..errors import InputError

# <linux/fs.h>: FS_IOC_GETFLAGS and the inode flags that forbid writing, even for root
_GETFLAGS = 0x80086601
_IMMUTABLE, _APPEND = 0x10, 0x20


def _flags(path: Path) -> int:
    """The file's inode flags (`lsattr`); 0 where the file system keeps none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(fd, _GETFLAGS, b"\0" * 4))[0]
    except OSError:                      # tmpfs and others: no such flags
        return 0
    finally:
        os.close(fd)


def check_writable(db: Path) -> None:
    """An InputError naming the first of the database's files that exists and cannot be
    written (immutable, append-only, or not writable by this user), with the fix."""
    for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        if not path.is_file():
            continue
        flags, shown = _flags(path), str(path)
        if flags & (_IMMUTABLE | _APPEND):
            what, opt = (("immutable", "i") if flags & _IMMUTABLE else ("append-only", "a"))
            raise InputError(
                f"--db: the SQLite file {shown!r} is {what} (chattr +{opt}); SQLite must "
                f"write it (a server would die on it with SIGBUS); run `chattr -{opt} "
                f"{shown}`, then start again")
        if not os.access(path, os.W_OK):
            raise InputError(
                f"--db: the SQLite file {shown!r} is not writable by this user (uid "
                f"{os.getuid()}); SQLite must write it; make it writable (chown or `chmod "
                f"u+w {shown}`) or run as its owner, then start again")
