"""Result folders that never destroy a user's files.

Before a run simulates anything, `claim_output()` checks its output folder and locks it:

- a file, the current folder (or one of its parents) and a folder servesim did not write are
  refused: we never delete or replace what is not ours;
- an earlier servesim result is replaced only with `overwrite=True` (a sweep folder is resumed);
- the parent must be writable (checked now, not after an hour of simulation);
- one run at a time: a lock file beside the folder (`.NAME.lock`, removed on release) makes a
  second run on the same folder refuse with the first one's pid;
- staging folders a killed run left beside it (`.NAME.servesim-tmp.*`, `.NAME.old`) are removed.

Every result folder carries a `.servesim` marker naming what wrote it, and only the marker makes
a folder ours: a folder that merely holds files with our names (summary.json, config.yaml) is
not. Single result files follow the same rule in outfile.py.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from servesim.traces.errors import InputError

MARKER = ".servesim"  # inside every result folder: "replay", "cluster" or "sweep"
TMP_TAG = "servesim-tmp"  # staging folders: .NAME.servesim-tmp.XXXXXXXX beside the result


def umask() -> int:
    """The process umask (os.umask can only be read by setting it)."""
    old = os.umask(0o022)
    os.umask(old)
    return old


def share_like_umask(path: Path) -> None:
    """mkdtemp creates 0700 folders; a result folder gets the mode any other folder would."""
    os.chmod(path, 0o777 & ~umask())


def result_kind(folder: Path) -> str | None:
    """What wrote `folder` ("replay", "cluster", "sweep", "plots", ...), from its `.servesim`
    marker; None for a folder servesim did not write (a marker that is a link is not ours)."""
    marker = Path(folder) / MARKER
    if marker.is_symlink() or not marker.is_file():
        return None
    return marker.read_text().strip() or "replay"


def is_result(folder: Path) -> bool:
    return result_kind(folder) is not None


def make_staging(out_dir: Path) -> Path:
    """An empty staging folder beside out_dir (same filesystem: publishing is one rename)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.{TMP_TAG}.", dir=out_dir.parent))
    share_like_umask(tmp)
    return tmp


def mark(folder: Path, kind: str) -> None:
    (Path(folder) / MARKER).write_text(kind + "\n")


def check_output(out_dir: str | Path, *, overwrite: bool = False, resume: str | None = None,
                 flag: str = "--out") -> Path:
    """Refuse an output folder we must not write (see the module docstring); creates nothing.
    resume="sweep": an existing sweep folder is continued, not replaced."""
    out = Path(out_dir).expanduser()
    resolved = out.resolve()
    if resolved == Path.cwd() or resolved in Path.cwd().parents or resolved == resolved.parent:
        raise InputError(f"{out} is the current folder or one of its parents; results need a folder of their own",
                         field=flag, allowed="a new or empty folder, e.g. runs/NAME")
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} is a file, not a folder; servesim will not replace it", field=flag,
                         allowed="a new or empty folder")
    if out.is_dir() and any(out.iterdir()):
        if not is_result(out):
            first = sorted(p.name for p in out.iterdir())[:3]
            raise InputError(f"{out} already exists and is not a servesim result (it holds {', '.join(first)}...); "
                             "servesim never replaces folders it did not write", field=flag,
                             allowed="a new or empty folder")
        kind = result_kind(out)
        if resume is not None and kind != resume:
            raise InputError(f"{out} holds a servesim {kind} result, not a {resume}", field=flag,
                             allowed=f"a new or empty folder, or a {resume} folder to resume")
        if resume is None and not overwrite:
            raise InputError(f"{out} holds an earlier servesim result", field=flag,
                             allowed=f"--overwrite to replace it, or another {flag}")
    check_writable(out, flag)
    return out


def check_writable(out: Path, flag: str) -> None:
    """Probe the folder that will receive the result (or its nearest existing ancestor: nothing is
    created here, so a refused run leaves no empty parents behind)."""
    target = out if out.is_dir() else next((p for p in out.parents if p.exists()), Path("/"))
    try:
        if not target.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(target))
        fd, probe = tempfile.mkstemp(prefix=f".{TMP_TAG}.probe.", dir=target)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        where = e.filename or target
        raise InputError(f"cannot write results to {out}: {e.strerror or e} ({where})", field=flag,
                         allowed="a folder you can write to") from None


@contextlib.contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """An OSError raised inside without a path (a write() that hit a full disk, pyarrow's I/O
    errors) is raised again naming `path`, the output the user gave: never a bare "No space left
    on device". Errors that name their own file pass unchanged."""
    try:
        yield
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, f"{e.strerror or e} (while writing)", str(path)) from None


def clean_stale(out_dir: Path) -> None:
    """Remove what a killed run left beside out_dir (only our own tagged staging names)."""
    out_dir = Path(out_dir)
    for p in out_dir.parent.glob(f".{out_dir.name}.{TMP_TAG}.*"):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    old = out_dir.with_name(f".{out_dir.name}.old")
    if old.is_dir() and is_result(old):
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def locked(out_dir: str | Path, flag: str = "--out") -> Iterator[None]:
    """Hold `.NAME.lock` beside out_dir; a second holder is refused with the first one's pid."""
    out_dir = Path(out_dir)
    lock = out_dir.with_name(f".{out_dir.name}.lock")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    while True:
        try:  # never through a link planted at the lock's name (it would truncate its target)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise InputError(f"{lock} is a symbolic link; servesim will not lock through it", field=flag,
                             allowed="remove the link, or another " + flag) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES):
                raise InputError(f"another servesim run (pid {holder}) is writing {out_dir}", field=flag,
                                 allowed=f"wait for it to finish, or another {flag}") from None
            raise
        try:  # the file we locked may have been unlinked by a holder releasing it: lock the new one
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


@contextlib.contextmanager
def claim_output(out_dir: str | Path, *, overwrite: bool = False, resume: str | None = None,
                 flag: str = "--out") -> Iterator[Path]:
    """check_output + locked + clean_stale, for the whole run (simulation and writing)."""
    out = check_output(out_dir, overwrite=overwrite, resume=resume, flag=flag)
    created = next((p for p in reversed([out, *out.parents]) if not p.exists()), None)
    try:
        with locked(out, flag):
            check_output(out, overwrite=overwrite, resume=resume, flag=flag)  # again, now that we hold it
            clean_stale(out)
            yield out
    except BaseException:
        if created is not None and not out.exists():
            _remove_empty_tree(created)  # the parents we made for a run that wrote nothing
        raise


def _remove_empty_tree(top: Path) -> None:
    for p in sorted((q for q in top.rglob("*") if q.is_dir()), key=lambda q: len(q.parts), reverse=True):
        with contextlib.suppress(OSError):
            p.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()


# Folders publish_dir completed since forget_published(): a Ctrl-C that lands after a command
# published its results (while it prints its summary) must say they are complete, not "nothing
# was written" (servesim/cli.py's interrupt note).
_published: list[Path] = []


def published_folders() -> list[Path]:
    """The folders published since the last forget_published(), in order."""
    return list(_published)


def forget_published() -> None:
    _published.clear()


def publish_dir(tmp: Path, out_dir: Path) -> None:
    """Move a finished staging folder to out_dir, replacing an older result (checked with
    check_output) only at the end. An empty folder is replaced by the rename itself."""
    if out_dir.is_dir() and any(out_dir.iterdir()):
        old = make_staging(out_dir)
        os.replace(out_dir, old / "previous")
        os.replace(tmp, out_dir)
        _published.append(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out_dir)
        _published.append(out_dir)


@contextlib.contextmanager
def staged_output(out_dir: str | Path, kind: str, *, overwrite: bool = False, flag: str = "--out") -> Iterator[Path]:
    """For commands that write several files: yield a staging folder, publish it as out_dir (marked
    `kind`) when the block ends normally; on an error or Ctrl-C nothing is published."""
    with claim_output(out_dir, overwrite=overwrite, flag=flag) as out:
        tmp = make_staging(out)
        try:
            with naming(out):
                yield tmp
                mark(tmp, kind)
                publish_dir(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
