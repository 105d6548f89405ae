# SPDX-License-Identifier: BSD-3-Clause
"""What the Python integration tests share: their failure types, the two
checks every case uses, wait_until, and the runner that prints "ok NAME",
"FAIL NAME: why" or "skip NAME: why" per case and a closing
"N passed, M failed, K skipped" line.  Standard library only."""

import os
import signal
import subprocess
import sys
import time
import traceback


class Failure(Exception):
    """A check failed: printed without a traceback."""


class Skip(Exception):
    """The case cannot run here (a missing peer or feature)."""


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def eq(got, want, what):
    if got != want:
        raise Failure("%s: got %r, want %r" % (what, got, want))


def wait_until(seconds, cond, interval=0.02):
    """Call cond() until it returns something true (returned) or seconds
    have passed (then the last result, false).  Use it instead of
    sleeping."""
    deadline = time.monotonic() + seconds
    while True:
        got = cond()
        if got or time.monotonic() >= deadline:
            return got
        time.sleep(interval)


def blockport_usable(path):
    """The binary under test, or a printed reason to exit 77."""
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        return True
    print("SKIP: BLOCKPORT is unset or not executable (%r)" % path)
    return False


def built_with(blockport):
    """The optional parts the binary was built with (core/features.h), as
    `blockport --version` lists them: {"rbd", "fuse", "tls", ...}."""
    out = subprocess.run([blockport, "--version"], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("built with:"):
            return set(line.split(":", 1)[1].split())
    return set()


def require_feature(blockport, part):
    """Skip the case unless the binary was built with PART."""
    if part not in built_with(blockport):
        raise Skip("blockport was built without %s" % part)


def run(cases, wanted, run_case, expected=()):
    """Run cases ([(name, fn)]), or only those named in wanted.

    run_case(fn) runs one case in its own environment.  An exception may
    carry `details` (lines about the processes involved), printed after
    its FAIL line.  Exceptions of the types in `expected` are failures of
    the peer under test (a protocol error, a closed socket) and print
    without a traceback; any other is a bug in the test and prints one.
    Returns the exit status: 1 any failed or unknown, 77 none passed (all
    skipped: nothing was tested), 0 otherwise.  Processes a case left
    behind are named and killed at the end."""
    names = [name for name, _ in cases]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        print("unknown case(s): %s" % ", ".join(unknown))
        return 1
    passed = failed = skipped = 0
    for name, fn in cases:
        if wanted and name not in wanted:
            continue
        try:
            run_case(fn)
        except Skip as e:
            skipped += 1
            print("skip %s: %s" % (name, e))
        except Exception as e:  # noqa: BLE001 (reported, then the next case)
            failed += 1
            _report(name, e, expected)
        else:
            passed += 1
            print("ok %s" % name)
        sys.stdout.flush()
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    reap_leftovers()
    if failed:
        return 1
    return 0 if passed else 77


def _children(pids):
    """The live descendants of pids, as {pid: start time}."""
    parent, start = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X"):
            parent[int(d)] = int(fields[1])
            start[int(d)] = fields[19]
    found, pending = {}, list(pids)
    while pending:
        p = pending.pop()
        for c, pp in parent.items():
            if pp == p and c not in found:
                found[c] = start[c]
                pending.append(c)
    return found


def reap_leftovers():
    """Name and kill the processes the cases started and left running."""
    kids = _children([os.getpid()])
    for pid in kids:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            print("# cleanup: killing leftover process %d (%s)" % (pid, cmd))
            os.kill(pid, signal.SIGSTOP)
        except OSError:
            pass
    for pid in _children([os.getpid()]):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in kids:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass


def _report(name, e, expected):
    if isinstance(e, Failure):
        print("FAIL %s: %s" % (name, e))
    elif isinstance(e, expected):
        print("FAIL %s: %s: %s" % (name, type(e).__name__, e))
    else:
        print("FAIL %s: unexpected %s: %s" % (name, type(e).__name__, e))
        for line in traceback.format_exc().splitlines():
            print("#   " + line)
    for line in getattr(e, "details", ()):
        print("#   " + line)
