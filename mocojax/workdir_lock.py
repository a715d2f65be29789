"""One run per workdir: `python -m mocojax.main` holds <workdir>/.mocojax.lock while it runs.

Two runs writing one workdir interleave checkpoints, metrics rows and rl_samples.jsonl, and the
damage shows only later (a resume from the other run's step). So the second run stops at once,
naming the first (pid, host, start time, command). A lock left by a run that died without
cleaning up (kill -9, a lost node) is taken over when it names a process of this host that no
longer runs; one that names another host cannot be checked from here, and a run refuses it
unless told the other run is gone (`--break_lock`, e.g. a SLURM requeue onto another node).
Only process 0 of a multi-process run takes the lock; the others share its workdir by design.
"""

import contextlib
import json
import logging
import os
import socket
import sys
import time

LOCK_NAME = ".mocojax.lock"


class WorkdirInUse(RuntimeError):
    """Another run holds the workdir; holder describes it (pid, host, start time, command)."""

    def __init__(self, message, holder=""):
        super().__init__(message)
        self.holder = holder


def _process_alive(pid: int) -> bool:
    """True when pid is a running (not zombie) process of this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            # the state follows the parenthesised command name, which may hold spaces
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _read_owner(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None  # torn or unreadable: treated like a lock of an unknown owner


def _describe(owner, path):
    if owner is None:
        return f"an unreadable lock file {path}"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.get("started", 0)))
    return (
        f"pid {owner.get('pid')} on {owner.get('host')} since {started} "
        f"({' '.join(owner.get('argv', []))[:200]})"
    )


def acquire(workdir: str, break_lock: bool = False) -> str:
    """Creates <workdir>/.mocojax.lock naming this process; returns its path.

    Raises WorkdirInUse when a live run holds it (or one on another host, unless break_lock).
    """
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, LOCK_NAME)
    host = socket.gethostname()
    me = {"pid": os.getpid(), "host": host, "started": time.time(), "argv": sys.argv}
    for _ in range(3):  # a lock removed between our attempts (its run just ended) is retried
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = _read_owner(path)
            same_host = owner is not None and owner.get("host") == host
            holder = _describe(owner, path)
            if same_host and _process_alive(int(owner.get("pid", -1))):
                raise WorkdirInUse(
                    f"workdir {workdir} is in use by another mocojax run: {holder}. "
                    "Use another --workdir, or stop that run first.",
                    holder,
                ) from None
            if not same_host and not break_lock:
                raise WorkdirInUse(
                    f"workdir {workdir} is locked by {holder}, which this host "
                    f"cannot check. If that run is gone, pass --break_lock (or delete {path}).",
                    holder,
                ) from None
            logging.warning(
                "workdir %s: taking over the lock of a run that is gone: %s", workdir, holder
            )
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return path
    raise WorkdirInUse(f"workdir {workdir}: could not take {path} (other runs keep taking it)")


def release(path: str) -> None:
    """Removes the lock if it still names this process."""
    owner = _read_owner(path)
    if owner is not None and owner.get("pid") == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


@contextlib.contextmanager
def hold(workdir: str, is_main: bool = True, break_lock: bool = False):
    """Holds the workdir's lock for the with-block (process 0 only: is_main)."""
    if not is_main:
        yield
        return
    path = acquire(workdir, break_lock)
    try:
        yield
    finally:
        release(path)
