"""What the Python integration tests share: their failure types, the two
checks every case uses, and the runner that prints "ok NAME",
"FAIL NAME: why" or "skip NAME: why" per case and a closing
"N passed, M failed" line.  Standard library only."""

import os
import sys
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


def blockport_usable(path):
    """The binary under test, or a printed reason to exit 77."""
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        return True
    print("SKIP: BLOCKPORT is unset or not executable (%r)" % path)
    return False


def run(cases, wanted, run_case, expected=()):
    """Run cases ([(name, fn)]), or only those named in wanted.

    run_case(fn) runs one case in its own environment.  An exception may
    carry `details` (lines about the processes involved), printed after
    its FAIL line.  Exceptions of the types in `expected` are failures of
    the peer under test (a protocol error, a closed socket) and print
    without a traceback; any other is a bug in the test and prints one.
    Returns the exit status: 0 all passed, 1 any failed or unknown."""
    names = [name for name, _ in cases]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        print("unknown case(s): %s" % ", ".join(unknown))
        return 1
    passed = failed = 0
    for name, fn in cases:
        if wanted and name not in wanted:
            continue
        try:
            run_case(fn)
        except Skip as e:
            print("skip %s: %s" % (name, e))
        except Exception as e:  # noqa: BLE001 (reported, then the next case)
            failed += 1
            _report(name, e, expected)
        else:
            passed += 1
            print("ok %s" % name)
        sys.stdout.flush()
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


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
