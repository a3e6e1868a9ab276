"""The reaper of a private local Ray cluster: run by path (stdlib only, no servesim import) as
`python ray_reaper.py MARKER FOLDER DRIVER_PID` in a session of its own, with its stdin a pipe from
the driver.

It blocks reading stdin. The driver never writes: the pipe ends when the driver's process ends,
however it ends (a normal exit, an exception, SIGTERM, SIGKILL). Then it kills every process of
the cluster -- those carrying MARKER in their environment (the driver set it before `ray.init`, so
the GCS, raylet, agents, log monitor and workers all inherited it; the reaper was started before
and has not) or holding FOLDER, the cluster's private temporary folder, in their command line or
open files -- repeating until none is left (a dying raylet may still start one), and removes
FOLDER. Without it a SIGKILLed driver
leaves Ray's agents running for a minute or two and its session folder behind.

Linux only (/proc); elsewhere it only removes the folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time

KILL_ROUNDS = 50  # at most 5 s of rounds 0.1 s apart: enough for a raylet's last spawn to show up
ROUND_S = 0.1
GRACE_S = 3.0  # how long the folder is watched after its removal


def marked_pids(marker: bytes, folder: str, spared: int = 0) -> list[int]:
    """Processes (other than this one) of the cluster: holding the entry `marker` (NAME=VALUE) in
    their environment, or `folder` in their command line or among their open files. All three:
    a process that renames itself (setproctitle: Ray's agents) overwrites what /proc shows of its
    environment, but still holds its log files in the session folder. Never `spared` (the driver:
    alive when a sweep ends normally, and still holding files of the folder)."""
    if not os.path.isdir("/proc"):
        return []
    found = []
    inside = folder.rstrip("/") + "/"
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in (os.getpid(), spared) and _is_marked(f"/proc/{entry}", marker, inside):
            found.append(int(entry))
    return found


def _is_marked(proc: str, marker: bytes, inside: str) -> bool:
    try:
        with open(f"{proc}/environ", "rb") as fh:
            if marker in fh.read().split(b"\0"):
                return True
        with open(f"{proc}/cmdline", "rb") as fh:
            if inside.encode() in fh.read():
                return True
        for fd in os.listdir(f"{proc}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"{proc}/fd/{fd}").startswith(inside):
                    return True
    except OSError:  # gone, or not ours to read
        return False
    return False


def kill_marked(marker: bytes, folder: str, spared: int = 0) -> int:
    """SIGKILL every marked process until none is left; how many were killed."""
    killed: set[int] = set()
    for _ in range(KILL_ROUNDS):
        pids = marked_pids(marker, folder, spared)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        time.sleep(ROUND_S)
    return len(killed)


def main(argv: list[str]) -> int:
    marker, folder, driver = argv[1].encode(), argv[2], int(argv[3])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the driver is not for us
    try:
        while sys.stdin.buffer.read(1 << 16):
            pass
    except OSError:
        pass
    kill_marked(marker, folder, driver)
    remove_folder(marker, folder, driver)
    with contextlib.suppress(OSError):  # the driver, if alive, waits for this line, not for the watch below
        sys.stdout.write("removed\n")
        sys.stdout.flush()
    # A straggler (a Ray process the kill rounds had not seen yet, or the exiting driver's own Ray
    # shutdown at interpreter exit) may make the session folder again just after: watch a while.
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        time.sleep(ROUND_S)
        if os.path.exists(folder) or marked_pids(marker, folder, driver):
            kill_marked(marker, folder, driver)
            remove_folder(marker, folder, driver)
    return 0


def remove_folder(marker: bytes, folder: str, spared: int = 0) -> bool:
    """Remove `folder`, again while something still writes into it (a killed process's last file
    makes rmtree's final rmdir fail, ENOTEMPTY, on a loaded machine): whether it is gone."""
    for _ in range(KILL_ROUNDS):
        shutil.rmtree(folder, ignore_errors=True)
        if not os.path.exists(folder):
            return True
        kill_marked(marker, folder, spared)
        time.sleep(ROUND_S)
    return not os.path.exists(folder)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
