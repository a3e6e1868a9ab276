"""Result files that never destroy a user's files: the one rule every flag that writes a single
file follows (`--out FILE` of step-trace, calibrate, calibrate-frontend and fit, replay's
`--step-trace`, calibrate's side files). Folders follow the same rule in outdir.py.

- checked before any work (`check_output_file`): a folder is refused, an existing file is replaced
  only with `--overwrite`, the folder that will hold it must be writable;
- written atomically (`atomic_path` / `atomic_text`): the bytes go to a temporary file beside the
  target (created with O_EXCL, so never through a planted symlink), which is renamed over the
  target only once complete; an error or Ctrl-C removes it and leaves the target as it was.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from servesim.simulator.outdir import TMP_TAG, check_writable, naming, umask
from servesim.traces.errors import InputError


def check_output_file(path: str | Path, *, overwrite: bool = False, flag: str = "--out") -> Path:
    """A single result file (a trace, a fitted model, a profile): an existing file is replaced only
    with overwrite, a folder never; the folder that will hold it must be writable. Creates nothing."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise InputError(f"{path} is a folder; {flag} names a file here", field=flag, allowed="a file path")
    if path.is_symlink() and not overwrite:
        raise InputError(f"{path} is a symbolic link; servesim will not write through it", field=flag,
                         allowed=f"--overwrite to replace the link itself, or another {flag}")
    if path.exists() and not overwrite:
        raise InputError(f"{path} already exists; servesim will not replace it", field=flag,
                         allowed=f"--overwrite to replace it, or another {flag}")
    check_writable(path, flag)
    return path


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary path beside `path` for a writer that takes a path (to_csv, savefig);
    rename it to `path` when the block ends normally, remove it otherwise. The rename replaces a
    symlink at `path` rather than writing through it."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{TMP_TAG}.", dir=path.parent)
    os.close(fd)
    try:
        with naming(path):
            yield Path(tmp)
            os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600; a result gets the usual mode
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def atomic_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` atomically (see atomic_path)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)

