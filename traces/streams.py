"""Trace inputs that are streams, not files: /dev/stdin, a named pipe (FIFO), a process
substitution (`<(zcat trace.jsonl.gz)`, /dev/fd/N), a character device.

Sniffing a format opens a trace several times (encoding, first keys, then the loader), which a
stream cannot answer: it is read once, up to MAX_STREAM_BYTES, into a private temporary folder
(mode 0700, removed afterwards) under the stream's own name, and loaded from there. Messages name
the stream, never the temporary copy; a result built from it records that it cannot be rebuilt
(the stream is gone once read).
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from servesim.traces.errors import InputError

# The bundled and shared traces are a few MB and a measured hour of a production trace tens of MB;
# 1 GiB bounds an endless stream (`yes |`, /dev/zero) long before it fills a disk.
MAX_STREAM_BYTES = 2**30
_CHUNK_BYTES = 2**20


def is_stream(path: Path) -> bool:
    """True for a path that exists and is not a regular file or folder (a pipe, a socket, a
    character device), following symlinks (/dev/stdin -> /proc/self/fd/0 -> pipe)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


def os_error(exc: OSError, path: Path | str, doing: str) -> InputError:
    """An InputError for an OS error met while `doing` something with `path`, naming both."""
    reason = exc.strerror or str(exc)
    allowed = {errno.EACCES: "a file you may read (check its permissions)",
               errno.EISDIR: "a file, not a folder",
               errno.ENOSPC: "a place with free space"}.get(exc.errno or 0)
    return InputError(f"cannot {doing}: {reason}", path=str(path), allowed=allowed)


@contextmanager
def spooled(path: Path, max_bytes: int = MAX_STREAM_BYTES) -> Iterator[Path]:
    """Read the stream at `path` once into a private temporary file named like it; yield that
    file's path (removed on exit). InputError naming `path` when it is longer than max_bytes or
    cannot be read, or when the copy cannot be written."""
    with tempfile.TemporaryDirectory(prefix="servesim-stream-") as folder:  # created 0700
        copy = Path(folder) / (path.name or "stream")
        total = 0
        try:
            with open(path, "rb") as src, open(copy, "xb") as dst:
                while chunk := src.read(_CHUNK_BYTES):
                    total += len(chunk)
                    if total > max_bytes:
                        raise InputError(f"the stream is longer than {max_bytes // 2**20} MiB", path=str(path),
                                         allowed="a shorter stream, or save the trace to a file and give its path")
                    dst.write(chunk)
        except OSError as exc:
            doing = f"copy the stream to {folder}" if exc.filename == str(copy) else "read the stream"
            raise os_error(exc, path, doing) from None
        yield copy
