"""The `servesim` command line (typer). Each command lives in its own module under servesim/commands.

Behaves like the tools our users know (vLLM's CLI): `-h`, `--version`, `--x/--no-x` switches, shell
completion, errors that name the flag, and a Ctrl-C that says what was kept and exits 130.

Start-up: this module imports only the standard library. typer (and the pydantic it brings, ~0.25 s) is
imported when `app` is first asked for (PEP 562 __getattr__), so `servesim --version` never loads it;
pandas, pyarrow, matplotlib and torch load only inside the commands that use them
(tests/test_startup.py keeps it so).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import warnings
from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

    from servesim.traces.errors import InputError

# Every command module registers itself with @app.command() on import.
COMMANDS = ("replay", "steptrace", "fit", "calibrate", "calibrate_frontend", "validate", "validate_bench", "run",
            "plot", "plan", "cluster", "compare", "export_trace")

# What the running command wants said if it is interrupted (set by the command, see on_interrupt).
_interrupt_note: list[str] = []
_interrupt_folder: list[Path] = []  # the note's folder: published -> the note no longer holds

# Configuration fields the top-level flags set: an error on the field names the flag instead.
FLAG_OF_FIELD = {"model": "--model", "gpu": "--gpu", "tp": "--tp", "cost_model": "--cost-model",
                 "engine": "--engine", "fmt": "--format", "hardware.model": "--model", "hardware.gpu": "--gpu",
                 "hardware.tp": "--tp", "hardware.pp": "--pp", "cost_model.name": "--cost-model", "num_requests": "--max-requests",
                 "rate_scale": "--rate-scale"}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("servesim")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown (not installed)"


def _version_text() -> str:
    from servesim._native import kernels_mode, scheduler_mode, simulator_mode

    return (f"servesim {_version()}\nscheduler: {scheduler_mode()}\nsimulator engine: {simulator_mode()}\n"
            f"simulator kernels: {kernels_mode()}")


def _show_version(value: bool) -> None:
    import typer

    if value:
        typer.echo(_version_text())
        raise typer.Exit()


def _make_app() -> typer.Typer:
    import typer

    app = typer.Typer(add_completion=True, no_args_is_help=True, rich_markup_mode=None,
                      help="servesim: simulate LLM serving engines.",
                      context_settings={"help_option_names": ["-h", "--help"]})

    @app.callback()
    def _root(version: bool = typer.Option(False, "--version", "-V", callback=_show_version, is_eager=True,
                                           help="print the version and exit")) -> None:
        """servesim: simulate LLM serving engines (vLLM V1 scheduler) on a SimPy clock or a GPU."""

    return app


def __getattr__(name: str):
    """`app` is built on first use: importing typer is most of a `--help`'s time, none of `--version`'s."""
    if name == "app":
        globals()["app"] = app = _make_app()
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def on_interrupt(note: str, unless_published: str | Path | None = None) -> None:
    """Say `note` (what was kept, how to resume) if the user interrupts the running command; when
    the folder `unless_published` was already published (the interrupt came while the command
    printed its summary), say that it is complete instead."""
    _interrupt_note[:] = [note]
    _interrupt_folder[:] = [] if unless_published is None else [Path(unless_published)]


def _register() -> None:
    if _registered:
        return
    _registered.append(True)
    for name in COMMANDS:
        try:
            __import__(f"servesim.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"servesim.commands.{name}":
                _broken(name, e)
        except Exception as e:  # a broken command must not take the others down with it
            _broken(name, e)
    from servesim.cli import app

    for info in app.registered_commands:
        info.callback = _guarded(info.callback)


_registered: list[bool] = []
_whole_process: list[bool] = []  # set by main(): the command's process ends when it returns


def _guarded(fn):
    """Run a command so that bad input, Ctrl-C and SIGTERM end in one clear line and an exit code
    (typer would print a bare "Aborted!" or nothing); works the same under CliRunner."""
    import typer

    from servesim.simulator.outdir import forget_published
    from servesim.traces.errors import InputError

    @functools.wraps(fn)
    def run(*args, **kwargs):
        _interrupt_note.clear()
        _interrupt_folder.clear()
        forget_published()
        old = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
        try:
            return fn(*args, **kwargs)
        except InputError as e:
            typer.secho(f"error: {format_error(e)}", fg="red", err=True)
            raise typer.Exit(2) from None
        except OSError as e:  # disk full, permissions: what and where, not a traceback
            where = f" ({e.filename})" if e.filename else ""
            typer.secho(f"error: {e.strerror or e}{where}", fg="red", err=True)
            raise typer.Exit(1) from None
        except (KeyboardInterrupt, Terminated) as e:
            what = "interrupted" if isinstance(e, KeyboardInterrupt) else "terminated"
            note = _interrupt_message()
            typer.secho(f"\n{what}: {note}", fg="yellow", err=True)
            raise typer.Exit(130 if isinstance(e, KeyboardInterrupt) else 143) from None
        finally:
            if old is not None:
                signal.signal(signal.SIGTERM, old)
            import gc

            if not _whole_process:  # see freeze_startup_objects
                gc.unfreeze()
            else:  # the process ends now: its final collection need not walk the run's objects
                gc.freeze()  # (a cluster's ~900 k KV blocks took ~0.35 s to walk at exit)
    return run


def _interrupt_message() -> str:
    """What an interrupt leaves: the command's note, unless the folder it speaks of was published
    before the interrupt (then complete)."""
    from servesim.simulator.outdir import published_folders

    done = {p.resolve() for p in published_folders()}
    if _interrupt_folder and _interrupt_folder[0].resolve() in done:
        return f"{_interrupt_folder[0]}/ is complete (it was written before the interrupt)"
    return _interrupt_note[0] if _interrupt_note else "nothing was written"


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _broken(name: str, err: Exception) -> None:
    import typer

    from servesim.cli import app

    @app.command(name, help=f"(unavailable: {err})")
    def _unavailable() -> None:
        typer.secho(f"error: the '{name}' command failed to load: {err!r}", fg="red", err=True)
        sys.exit(2)


def format_error(e: InputError) -> str:
    """The message, with the flag named where the error is about a value a flag set."""
    flag = e.field if e.field and e.field.startswith("--") else FLAG_OF_FIELD.get(e.field or "")
    if flag is None and e.path is None and e.field and "." in e.field:  # a dotted key: only --set gives one
        flag = f"--set {e.field}"
    if flag is None or (e.path is not None and e.field != "fmt"):  # a field of a file, not a flag
        return str(e)
    where = "" if e.path is None else e.path + (f", line {e.line}" if e.line is not None else "") + ": "
    return f"{where}{flag}: {e.detail}" + (f" (allowed: {e.allowed})" if e.allowed else "")


def freeze_startup_objects() -> None:
    """Call once a command has imported what it needs and built its inputs, just before the long run.

    Why: every full garbage collection walks every tracked object; the modules, the configuration and
    the workload (each prompt's token ids) live until the process ends, yet were walked again and again
    during the run and once more at exit. gc.freeze() moves them out of the collector's view (measured
    on the bundled default: collector time 0.25 -> 0.10 s, exit 0.35 -> 0.15 s). Objects frozen are
    still freed by reference counting; only a cycle among them would outlive the command, and the
    process ends with it; a command run in-process (CliRunner, a notebook) is unfrozen when it returns
    (_guarded), so repeated runs there leak nothing. Results do not depend on the collector.
    """
    import gc

    gc.freeze()


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that cleanup (finally blocks) runs."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


def quiet_third_party() -> None:
    """Keep other libraries' warnings out of our output (our own messages are what the user reads)."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("ray", "numexpr", "matplotlib", "torch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")  # inherited by worker processes


# The variables OpenBLAS reads for its thread count (the first one set wins); a user's choice is kept.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def cap_blas_threads() -> None:
    """One OpenBLAS thread for this process and its workers, unless the user chose a count.

    Why: numpy's OpenBLAS starts a thread per core when numpy is imported, and each spins on a
    core for a while before it sleeps, beside the main thread that is importing everything
    else (measured: `import numpy` took 0.13 s with one thread and 0.20 s with one per core on the
    2-core machine). servesim does no BLAS work worth threads: the only matrix algebra is the
    cost-model fits' least squares over three columns (simulator/cost_model/fit_ops.py), and a
    replay none at all; parallel work is whole processes (replicates, sweeps). Must run before
    numpy is imported (this module imports only the standard library)."""
    if not any(name in os.environ for name in BLAS_THREAD_VARIABLES):
        os.environ["OPENBLAS_NUM_THREADS"] = "1"


def no_huge_page_faults() -> None:
    """numpy's large arrays in 4 KiB pages, unless the user chose (NUMPY_MADVISE_HUGEPAGE).

    Why: numpy asks the kernel for transparent huge pages on every array of 4 MiB or more
    (madvise), and where the kernel's THP defrag setting is `madvise` (a common default) a fault
    on such an array may first compact memory. A replay allocates a few arrays of tens of MB after
    the run (the inter-token gaps, their sorted copy, the tables' columns): measured on the 2-core
    machine, a fresh 32 MB array took 70 ms to fill with huge pages and 14 ms without, and the
    Azure hour's whole process 4.13-4.23 s without against 4.23-4.72 s with (three alternating
    pairs; its system time 0.24-0.31 s against 0.32-0.65 s). Each array is read a few times in
    sequence, where 4 KiB pages lose nothing measurable. Must run before numpy is imported."""
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")


def main() -> None:
    cap_blas_threads()
    no_huge_page_faults()
    if sys.argv[1:] in (["--version"], ["-V"]):  # what typer's eager option prints, without typer
        print(_version_text())
        return
    import typer

    from servesim.cli import app
    from servesim.traces.errors import InputError

    quiet_third_party()
    _whole_process[:] = [True]
    _register()
    try:
        app()
    except InputError as e:  # raised outside a command (while parsing)
        typer.secho(f"error: {format_error(e)}", fg="red", err=True)
        sys.exit(2)
    finally:  # a caller that goes on (a test calling main()) is the Python API again
        _whole_process.clear()
