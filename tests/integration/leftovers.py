#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The test suite's first and last step (ctest fixture "suite").

  leftovers.py start STAMP        record when this run of the suite began
  leftovers.py check STAMP TREE   fail if a process the run started is
                                  still alive; name it, then kill it

A process counts as started by the run when it began after `start`,
either carries BLOCKPORT_TEST_TREE=TREE in its environment (ctest sets it
for every test, and children inherit it) or names TREE in its command line
(for the few started with a scrubbed environment, such as the server under
systemd-socket-activate), and is an orphan: above it and its marked
ancestors is init (or the systemd user manager), where orphans go, or
this ctest.  Processes under another live ctest or a shell are that run's
(two runs in one build tree do not see each other's processes).  Other
builds' tests, other users' processes and processes older than the run
are never looked at.  Standard library only.
"""

import os
import signal
import sys
import time


def start_time(pid):
    """Clock ticks after boot at which pid started, or None."""
    try:
        with open("/proc/%s/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None  # exited; its parent has yet to reap it
    return int(fields[19])


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def parent(pid):
    try:
        with open("/proc/%s/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def is_orphan(pid, marked):
    """Whether the first unmarked ancestor of pid is where orphans go (or
    this ctest), not a live run of tests that will clean up itself."""
    while pid in marked:
        pid = parent(pid)
    if pid in (1, os.getppid()):
        return True
    return read("/proc/%d/comm" % pid).strip() == b"systemd"


def survivors(since, tree):
    marker = b"BLOCKPORT_TEST_TREE=" + tree.encode()
    mine = {os.getpid(), os.getppid()}
    marked = {}
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in mine:
            continue
        st = start_time(d)
        if st is None or st < since:
            continue
        env = read("/proc/%s/environ" % d).split(b"\0")
        cmd = read("/proc/%s/cmdline" % d)
        if marker in env or (tree + "/").encode() in cmd:
            marked[int(d)] = (st, cmd.replace(b"\0", b" ").decode(
                "utf-8", "replace").strip())
    return {pid: v for pid, v in marked.items() if is_orphan(pid, marked)}


def check(stamp, tree):
    try:
        with open(stamp) as f:
            since = int(f.read())
    except (OSError, ValueError):
        since = 0  # no start recorded: every process of this tree counts
    # A test's last processes may still be on their way out.
    deadline = time.monotonic() + 5
    found = survivors(since, tree)
    while found and time.monotonic() < deadline:
        time.sleep(0.1)
        found = survivors(since, tree)
    if not found:
        print("no process started by the tests is left")
        return 0
    print("FAIL: %d process(es) started by the tests are still running:"
          % len(found))
    for pid, (_, cmd) in sorted(found.items()):
        cwd = os.path.realpath("/proc/%d/cwd" % pid) if os.path.exists(
            "/proc/%d/cwd" % pid) else "?"
        print("  pid %d (cwd %s): %s" % (pid, cwd, cmd))
    for pid, (st, _) in found.items():
        if start_time(pid) == st:  # still that process, not a new one
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    print("killed them")
    return 1


def main(argv):
    if len(argv) == 2 and argv[0] == "start":
        with open(argv[1], "w") as f:
            f.write("%d\n" % start_time("self"))
        return 0
    if len(argv) == 3 and argv[0] == "check":
        return check(argv[1], os.path.realpath(argv[2]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
