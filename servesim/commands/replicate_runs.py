"""The replicate side of `servesim replay` and `servesim cluster` (--replicates N > 1): run them,
print the intervals. Kept apart so the commands' own modules only branch here."""

from __future__ import annotations

from pathlib import Path

from servesim.traces.errors import InputError


def _refuse(refused: dict[str, object]) -> None:
    for flag, value in refused.items():
        if value:
            raise InputError("not with --replicates > 1 (each replicate is a simulated run of its own)",
                             field=f"--{flag.replace('_', '-')}", allowed="--replicates 1, or leave it out")


def replay_replicates(cfg, workload_for, n: int, out: Path, *, overwrite: bool, workers: int | None, perturb: bool,
                      refused: dict[str, object]) -> None:
    from servesim.cli import freeze_startup_objects, on_interrupt
    from servesim.replicate_summary import print_replicates
    from servesim.replicates import check_replicates, run_replay_replicates
    from servesim.report import make_console

    check_replicates(n)
    _refuse(refused)
    err = make_console(stderr=True)
    err.print(f"replicates: {n} runs, {workers or 'one per CPU core'} worker(s)", highlight=False)
    on_interrupt(f"nothing was written to {out}/ (the replicates are published together when all finish); "
                 "run the same command again to start over", unless_published=out)
    freeze_startup_objects()
    summary = run_replay_replicates(cfg, workload_for, n, out, perturb=perturb, workers=workers, overwrite=overwrite,
                                    done=lambda i, s: err.print(f"  r{i:02d} done", highlight=False))
    print_replicates(make_console(), summary, out)


def cluster_replicates(cfg, workload_for, meta: dict, n: int, out: Path, *, overwrite: bool, workers: int | None,
                       perturb: bool) -> None:
    from servesim.replicate_summary import print_replicates
    from servesim.replicates import check_replicates, run_cluster_replicates
    from servesim.report import make_console

    check_replicates(n)
    err = make_console(stderr=True)
    summary = run_cluster_replicates(cfg, workload_for, meta, n, out, perturb=perturb, workers=workers,
                                     overwrite=overwrite, done=lambda i, s: err.print(f"  r{i:02d} done", highlight=False))
    print_replicates(make_console(), summary, out)
