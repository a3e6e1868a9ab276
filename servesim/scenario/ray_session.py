"""Ray like local: the private local cluster `--backend ray` starts (without --ray-address) leaves
nothing behind and answers signals as the local backend does.

- Its temporary folder is a fresh 0700 folder of ours (Ray's own default, /tmp/ray, is shared and
  Ray makes its session folders world-writable), removed when the sweep ends.
- A reaper process (ray_reaper.py, in a session of its own) kills every process of the cluster
  and removes that folder once the driver's process ends, however it ends: SIGKILL included.
- `ray.init` installs its own SIGTERM handler (and its core worker a C++ one that dumps a stack);
  the handlers in place before it are put back, so SIGTERM ends the sweep with servesim's note
  and status 143 and Ctrl-C with 130, as the local backend does.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

MARKER_NAME = "SERVESIM_RAY_REAPER"
REAPER_WAIT_S = 10.0  # how long a finished sweep waits for the reaper to clear up


@contextlib.contextmanager
def private_cluster() -> Iterator[Path]:
    """Yield the temporary folder for `ray.init(_temp_dir=...)`, inside a fresh private folder that
    the reaper removes with every marked process when the driver ends (or this block does)."""
    folder = Path(tempfile.mkdtemp(prefix="servesim-ray-"))  # created 0700
    token = secrets.token_hex(16)
    reaper = subprocess.Popen(  # started before the marker is set: it never carries it
        [sys.executable, str(Path(__file__).with_name("ray_reaper.py")), f"{MARKER_NAME}={token}", str(folder),
         str(os.getpid())],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    saved = os.environ.get(MARKER_NAME)
    os.environ[MARKER_NAME] = token  # every Ray process started from here on inherits it
    try:
        yield folder / "ray"
    finally:
        if saved is None:
            os.environ.pop(MARKER_NAME, None)
        else:
            os.environ[MARKER_NAME] = saved
        assert reaper.stdin is not None and reaper.stdout is not None
        reaper.stdin.close()  # the reaper's signal; the driver dying closes it the same way
        # Wait for its "removed" line (the cluster gone), not for its exit: it then watches the
        # folder a few seconds more on its own (ray_reaper.py GRACE_S).
        with contextlib.suppress(OSError, ValueError):
            if select.select([reaper.stdout], [], [], REAPER_WAIT_S)[0]:
                reaper.stdout.readline()
            reaper.stdout.close()


@contextlib.contextmanager
def our_signal_handlers() -> Iterator[None]:
    """Put SIGINT's and SIGTERM's handlers back as they were before the block (ray.init) ran."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)
