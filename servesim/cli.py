"""The `servesim` command line (typer). Each command lives in its own module under servesim/commands."""

from __future__ import annotations

import sys

import typer

from traces.errors import InputError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="servesim: simulate LLM serving engines.")


@app.callback()
def _root() -> None:
    """servesim: simulate LLM serving engines (vLLM V1 scheduler) on a SimPy clock or a GPU."""


def _register() -> None:
    from servesim.commands import steptrace  # noqa: F401  (registers on import)

    for name in ("replay", "fit", "calibrate", "validate", "run", "plot", "plan", "cluster"):
        try:
            __import__(f"servesim.commands.{name}")
        except ModuleNotFoundError as e:  # a command whose module is not there yet
            if e.name != f"servesim.commands.{name}":
                raise


def main() -> None:
    _register()
    try:
        app()
    except InputError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        sys.exit(2)
