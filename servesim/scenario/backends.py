"""Where variants run, by name: `local` (a process pool) or `ray` (tasks on a Ray cluster).

A backend takes the tasks and calls `done(outcome)` as each one finishes, in completion order, so
the driver can report and publish results while the rest still run.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

from servesim.scenario.ray_session import our_signal_handlers, private_cluster
from servesim.scenario.task import Outcome, VariantTask, execute
from servesim.scheduler.registry import Registry
from servesim.traces.errors import InputError, field_error

Backend = Callable[[list[VariantTask], Path, "int | None", "str | None", Callable[[Outcome], None]], None]
# Built-ins (local, ray) are below; every module of servesim/scenario/ is imported on the first
# lookup, so a new backend is one new file there.
BACKENDS: Registry[Backend] = Registry("backend", plugins="servesim.scenario", error=field_error("--backend"))


def register_backend(name: str):
    return BACKENDS.register(name)


def available_backends() -> list[str]:
    return BACKENDS.names()


def get_backend(name: str) -> Backend:
    return BACKENDS.get(name)


def default_workers(num_tasks: int) -> int:
    return max(1, min(num_tasks, os.cpu_count() or 1))


@register_backend("local")
def run_local(tasks: list[VariantTask], root: Path, workers: int | None, address: str | None,
              done: Callable[[Outcome], None]) -> None:
    """Workers write their own folders (same filesystem). One worker: run in this process (no
    start-up cost, same results); more: a spawn pool (safe with threads, same on every OS)."""
    if address:
        raise InputError("--ray-address only applies to --backend ray", field="--ray-address")
    for task in tasks:
        task.root = str(root)
    workers = workers or default_workers(len(tasks))
    if workers == 1:
        for task in tasks:
            done(execute(task))
        return
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=die_with_parent, initargs=(os.getpid(),))
    try:
        futures = {pool.submit(execute, task): task for task in tasks}
        pending = set(futures)
        while pending:
            # A timeout: a signal that lands on another thread must still reach this one (Ctrl-C).
            finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in finished:
                done(_result(fut, futures[fut]))
    except BaseException:  # Ctrl-C / SIGTERM: stop the workers now; finished variants are published
        _stop_workers(pool)
        raise
    pool.shutdown(wait=True)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    # The pool has no public way to end running work (shutdown waits for it); its processes are
    # ours to stop. Taken before shutdown, which forgets them.
    procs = list((pool._processes or {}).values())
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(timeout=5)
    pool.shutdown(wait=True, cancel_futures=True)


PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_POLL_S = 1.0


def die_with_parent(parent_pid: int) -> None:
    """Pool worker initializer: end this worker when the driver dies, however it dies (SIGKILL
    included), so no orphan keeps computing and publishing. Linux: the kernel sends SIGKILL when the
    parent exits (PR_SET_PDEATHSIG); everywhere: a thread that polls the parent pid. Ctrl-C goes to
    the driver, which stops the pool (workers ignore SIGINT)."""
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass  # the poll below still works
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="servesim-parent-watch", daemon=True).start()


def _result(fut, task: VariantTask) -> Outcome:
    try:
        return fut.result()
    except Exception as exc:  # noqa: BLE001 - a worker process died (OOM kill, segfault)
        _write_crash(task, exc)
        return Outcome(task.name, "error", f"worker died: {type(exc).__name__}: {exc}")


def _write_crash(task: VariantTask, exc: Exception) -> None:
    from servesim.scenario import store

    if task.root is not None:
        store.publish(task.root, task.name, {"error.txt": f"worker died: {exc!r}\n".encode(), **task.extra_files})


@register_backend("ray")
def run_ray(tasks: list[VariantTask], root: Path, workers: int | None, address: str | None,
            done: Callable[[Outcome], None]) -> None:
    """One Ray task per variant; results come back through the object store (a cluster's nodes
    need not share our filesystem) and are published here as each finishes (ray.wait). A local
    cluster of our own is private and leaves nothing behind (ray_session.py)."""
    env = {} if address else local_ray_env()
    saved = {k: os.environ.get(k) for k in env}
    imported_before = "ray" in sys.modules
    os.environ.update(env)  # before Ray is imported: it reads these once
    try:
        ray = _import_ray()
        if env and imported_before and not ray.is_initialized():
            _reread_ray_settings(ray)
        if ray.is_initialized():  # the caller's own Ray session: used as it is, left running
            _run_ray_tasks(ray, tasks, done)
        elif address:
            with our_signal_handlers():
                ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
            try:
                _run_ray_tasks(ray, tasks, done)
            finally:
                ray.shutdown()
        else:
            with private_cluster() as temp_dir:
                with our_signal_handlers():
                    ray.init(num_cpus=workers or default_workers(len(tasks)), include_dashboard=False,
                             logging_level=logging.ERROR, log_to_driver=False, _temp_dir=str(temp_dir))
                try:
                    _run_ray_tasks(ray, tasks, done)
                finally:
                    ray.shutdown()
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def _run_ray_tasks(ray, tasks: list[VariantTask], done: Callable[[Outcome], None]) -> None:
    remote = ray.remote(num_cpus=1, max_retries=0)(execute)
    refs = {remote.remote(task): task for task in tasks}
    pending = list(refs)
    while pending:
        finished, pending = _interruptible(ray.wait, pending, num_returns=1)
        for ref in finished:
            try:
                outcome = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - the task or its node died
                task = refs[ref]
                outcome = Outcome(task.name, "error", f"ray task died: {type(exc).__name__}: {exc}",
                                  files={"error.txt": repr(exc).encode(), **task.extra_files})
            done(outcome)


def _interruptible(call, *args, **kwargs):
    """call(*args, **kwargs), letting an interrupt through as itself: a signal handler's exception
    (Ctrl-C's KeyboardInterrupt, SIGTERM's) raised while Ray's Cython code waits comes back
    wrapped in a SystemError ("returned a result with an exception set")."""
    try:
        return call(*args, **kwargs)
    except SystemError as exc:
        cause = exc.__cause__
        if isinstance(cause, BaseException) and not isinstance(cause, Exception):
            raise cause from None
        raise


def local_ray_env() -> dict[str, str]:
    """Environment for the private local Ray cluster `--backend ray` starts without an address.

    It must not listen on the network: Ray turns a node address of 127.0.0.1 back into the machine's
    external address, but with clustering off (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, its single-node
    mode) every Ray process binds to loopback. On top, token authentication with a random token that
    only our process tree knows (held in the environment, never written to ~/.ray), so other local
    users cannot submit work either; it also silences Ray's warning about running without it."""
    import secrets

    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def _reread_ray_settings(ray) -> None:
    """Ray was imported earlier in this process (a notebook, a test) and has cached the settings
    local_ray_env changes; make it read them again. Private Ray names, so guarded: if they move,
    the cluster still starts (then on Ray's default interfaces)."""
    try:
        from ray._private import ray_constants
        from ray._raylet import Config

        ray_constants.ENABLE_RAY_CLUSTER = False
        Config.initialize("")
    except (ImportError, AttributeError):  # pragma: no cover - another Ray version
        logging.getLogger(__name__).warning("could not restrict the local Ray cluster to loopback")


def _import_ray():
    try:
        import ray
    except ImportError:
        raise InputError("the Ray backend needs Ray, which is not installed", field="--backend",
                         allowed="pip install servesim[ray] (or pip install 'ray>=2.9'), or --backend local") from None
    return ray
