"""Ray's processes of a job's own local session end with the job, even when it is killed.

`ray.shutdown()` stops them when the job exits, by any path Python sees. A job killed outright
(SIGKILL, the out-of-memory killer) runs no code, and Ray's processes then notice the missing
driver on their own time: some of its agents linger for up to a minute. So a job that starts Ray
here also starts a small watcher in a process session of its own: it notes the processes of this
Ray session while the job lives, and kills the ones still there once the job's process is gone. A session the
job joined (`ray job submit`, `ray_address`) belongs to the cluster and is never touched.
"""

from __future__ import annotations

import os
import subprocess
import sys

# The watcher reads the session's name from stdin, so that its own command line never matches
# it. Ray's workers and agents rename themselves ("ray::RolloutWorker") and so do not show the
# session: they are found as descendants of the processes that do (the raylet), and noted while
# the job lives, since the raylet may be gone by the time the job is.
_WATCHER = """
import os, signal, sys, time

job, session = int(sys.argv[1]), sys.stdin.read().strip()


def processes():
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                args = f.read().replace(b"\\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # state, parent, start time (clock ticks since boot: a reused pid has another)
        found[int(name)] = (fields[0], int(fields[1]), fields[19], args)
    return found


def session_tree(found):
    tree = {pid for pid, (_, _, _, args) in found.items() if session in args}
    grown = True
    while grown:
        children = {pid for pid, (_, parent, _, _) in found.items() if parent in tree}
        grown = not children <= tree
        tree |= children
    tree.discard(os.getpid())
    return {pid: found[pid][2] for pid in tree}


known = {}
while True:
    found = processes()
    known.update(session_tree(found))
    if job not in found or found[job][0] == "Z":  # gone, or a zombie: dead either way
        break
    time.sleep(0.5)
found = processes()
for pid, started in known.items():
    if pid in found and found[pid][2] == started:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
"""


def start_session_reaper(session_name: str) -> subprocess.Popen | None:
    """Watch this process; once it is gone, kill the processes of Ray session `session_name`.
    None where /proc is missing (not Linux): there Ray's own timeouts are left to do it."""
    if not session_name or not os.path.isdir("/proc"):
        return None
    watcher = subprocess.Popen(
        [sys.executable, "-c", _WATCHER, str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not in the job's process group: a Ctrl-C does not end it early
        text=True,
    )
    watcher.stdin.write(session_name)
    watcher.stdin.close()
    return watcher


def local_session_name() -> str | None:
    """The name of the Ray session this process started (Ray keeps it on its node object)."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    return getattr(node, "session_name", None)
