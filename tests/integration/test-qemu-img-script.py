#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""One qemu-img script, run twice (issue 31's proof): every step with
qemu-img in one directory and with blockport in another, on twin files.

Each step's exit status must be the same; a step with --output=json must
print the same JSON (parsed, so key order aside); a step marked "text"
the same lines.  After every step that writes, `qemu-img check` passes
on both twins and `qemu-img compare` finds them equal.  The images start
from the same bytes: qemu-io writes the data into both, so only the
tool under test differs.

The script is SCRIPT below, in the order an operator would run it.  A
step is (ARGS, HOW, IMAGES): ARGS as qemu-img takes them, HOW one of
"json", "text" or "status", IMAGES the files the step writes.
Environment dependent values are dropped from the JSON, each for a
reason given in NOISE."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import casetest  # noqa: E402
from casetest import Failure  # noqa: E402

BLOCKPORT = os.environ.get("BLOCKPORT", "")

# Keys whose values depend on the moment or on where a tool put its
# clusters, not on what the image holds: a snapshot's date (the clock);
# the file's allocation and end (qemu writes a metadata cluster's used
# bytes only, blockport whole clusters; each places new metadata where its
# allocator finds room), and so how fragmented the data is; for the same
# reason a map's host offsets (map_without_offsets()).
NOISE = {"date-sec", "date-nsec", "actual-size", "image-end-offset",
         "fragmented-clusters"}

# qemu-io writes the same data into both twins.
QEMU_IO = "qemu-io"


def io(*cmds, image, fmt="qcow2"):
    args = [QEMU_IO, "-f", fmt]
    for c in cmds:
        args += ["-c", c]
    return ("io", args + [image])


SCRIPT = [
    (["create", "-f", "qcow2", "base.qcow2", "64M"], "status", ["base.qcow2"]),
    io("write -P 0x11 0 1M", "write -P 0x22 8M 64k", "write -z 16M 1M",
       image="base.qcow2"),
    (["info", "--output=json", "base.qcow2"], "json", []),
    (["check", "--output=json", "base.qcow2"], "json", []),
    (["map", "--output=json", "base.qcow2"], "json", []),
    (["measure", "--output=json", "-O", "qcow2", "base.qcow2"], "json", []),
    (["measure", "--output=json", "--size", "10G", "-O", "qcow2", "-o",
      "cluster_size=2M"], "json", []),
    (["create", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2",
      "top.qcow2"], "status", ["top.qcow2"]),
    io("write -P 0x33 512k 1M", "write -P 0x44 32M 4k", image="top.qcow2"),
    (["info", "--output=json", "--backing-chain", "top.qcow2"], "json", []),
    (["map", "--output=json", "top.qcow2"], "json", []),
    (["map", "top.qcow2"], "text", []),
    (["measure", "-O", "qcow2", "top.qcow2"], "text", []),
    (["compare", "base.qcow2", "top.qcow2"], "status", []),
    (["convert", "-O", "qcow2", "top.qcow2", "flat.qcow2"], "status",
     ["flat.qcow2"]),
    (["compare", "top.qcow2", "flat.qcow2"], "text", []),
    (["convert", "-O", "raw", "flat.qcow2", "flat.raw"], "status",
     ["flat.raw"]),
    (["info", "--output=json", "flat.raw"], "json", []),
    (["convert", "-c", "-O", "qcow2", "flat.raw", "small.qcow2"], "status",
     ["small.qcow2"]),
    (["compare", "-f", "raw", "-F", "qcow2", "flat.raw", "small.qcow2"],
     "text", []),
    (["bitmap", "--add", "flat.qcow2", "b0"], "status", ["flat.qcow2"]),
    (["bitmap", "--add", "-g", "128k", "--disable", "flat.qcow2", "b1"],
     "status", ["flat.qcow2"]),
    (["info", "--output=json", "flat.qcow2"], "json", []),
    (["bitmap", "--merge", "b0", "--enable", "flat.qcow2", "b1"], "status",
     ["flat.qcow2"]),
    (["bitmap", "--remove", "flat.qcow2", "b0"], "status", ["flat.qcow2"]),
    (["measure", "--output=json", "-O", "qcow2", "flat.qcow2"], "json", []),
    (["resize", "flat.qcow2", "+64M"], "status", ["flat.qcow2"]),
    (["resize", "-f", "raw", "flat.raw", "96M"], "status", ["flat.raw"]),
    (["info", "--output=json", "flat.qcow2"], "json", []),
    (["check", "--output=json", "flat.qcow2"], "json", []),
    (["create", "-f", "qcow2", "-o", "compat=0.10,cluster_size=4k",
      "old.qcow2", "8M"], "status", ["old.qcow2"]),
    (["info", "--output=json", "old.qcow2"], "json", []),
    (["dd", "if=flat.raw", "of=part.raw", "bs=64k", "count=20", "skip=2"],
     "status", ["part.raw"]),
    # Internal snapshots.
    (["convert", "-O", "qcow2", "top.qcow2", "snap.qcow2"], "status",
     ["snap.qcow2"]),
    (["snapshot", "-c", "s1", "snap.qcow2"], "status", ["snap.qcow2"]),
    io("write -P 0x55 0 2M", "write -z 8M 64k", image="snap.qcow2"),
    (["snapshot", "-c", "s2", "snap.qcow2"], "status", ["snap.qcow2"]),
    (["snapshot", "-l", "snap.qcow2"], "status", []),
    (["info", "--output=json", "snap.qcow2"], "json", []),
    (["check", "--output=json", "snap.qcow2"], "json", []),
    (["convert", "-l", "s1", "-O", "raw", "snap.qcow2", "s1.raw"], "status",
     ["s1.raw"]),
    (["snapshot", "-a", "s1", "snap.qcow2"], "status", ["snap.qcow2"]),
    (["snapshot", "-d", "s2", "snap.qcow2"], "status", ["snap.qcow2"]),
    (["info", "--output=json", "snap.qcow2"], "json", []),
    (["snapshot", "-d", "nosuch", "snap.qcow2"], "status", []),
    (["snapshot", "-c", "x", "flat.raw"], "status", []),
    # amend.
    (["amend", "-o", "lazy_refcounts=on", "old.qcow2"], "status", []),
    (["amend", "-o", "compat=1.1", "old.qcow2"], "status", ["old.qcow2"]),
    (["amend", "-o", "lazy_refcounts=on", "old.qcow2"], "status",
     ["old.qcow2"]),
    (["amend", "-o", "refcount_bits=64", "flat.qcow2"], "status",
     ["flat.qcow2"]),
    (["info", "--output=json", "old.qcow2"], "json", []),
    (["info", "--output=json", "flat.qcow2"], "json", []),
    (["amend", "-o", "compat=0.10", "flat.qcow2"], "status", []),
    (["amend", "-o", "cluster_size=4k", "old.qcow2"], "status", []),
    (["amend", "-o", "size=16M", "old.qcow2"], "status", ["old.qcow2"]),
    # convert's other options: several sources, a rate limit.
    (["convert", "-O", "qcow2", "-r", "64M", "base.qcow2", "s1.raw",
      "cat.qcow2"], "status", ["cat.qcow2"]),
    (["info", "--output=json", "cat.qcow2"], "json", []),
    (["convert", "-O", "raw", "-B", "base.qcow2", "base.qcow2", "s1.raw",
      "bad.raw"], "status", []),
    # commit and rebase.
    (["convert", "-O", "qcow2", "base.qcow2", "cbase.qcow2"], "status",
     ["cbase.qcow2"]),
    (["create", "-f", "qcow2", "-b", "cbase.qcow2", "-F", "qcow2",
      "ctop.qcow2"], "status", ["ctop.qcow2"]),
    io("write -P 0x66 1M 2M", "write -z 0 64k", image="ctop.qcow2"),
    (["commit", "ctop.qcow2"], "text", ["cbase.qcow2", "ctop.qcow2"]),
    (["map", "--output=json", "ctop.qcow2"], "json", []),
    (["info", "--output=json", "--backing-chain", "ctop.qcow2"], "json", []),
    (["commit", "-b", "nosuch.qcow2", "ctop.qcow2"], "status", []),
    (["commit", "flat.raw"], "status", []),
    (["create", "-f", "qcow2", "-b", "cbase.qcow2", "-F", "qcow2",
      "r1.qcow2"], "status", ["r1.qcow2"]),
    io("write -P 0x77 3M 1M", image="r1.qcow2"),
    (["rebase", "-b", "base.qcow2", "-F", "qcow2", "r1.qcow2"], "status",
     ["r1.qcow2"]),
    (["info", "--output=json", "r1.qcow2"], "json", []),
    # Not the map: where the old chain read zeroes and the new backing
    # file does not, qemu-img 7.2 writes a cluster of zero bytes and
    # blockport a zero cluster (the same reads, no data allocated).
    (["map", "--output=json", "r1.qcow2"], "status", []),
    (["rebase", "-u", "-b", "flat.qcow2", "-F", "qcow2", "r1.qcow2"],
     "status", []),
    (["info", "--output=json", "r1.qcow2"], "json", []),
    (["rebase", "-u", "-b", "base.qcow2", "-F", "qcow2", "r1.qcow2"],
     "status", ["r1.qcow2"]),
    (["rebase", "-b", "", "r1.qcow2"], "status", ["r1.qcow2"]),
    (["info", "--output=json", "r1.qcow2"], "json", []),
    (["rebase", "-b", "base.qcow2", "r1.qcow2"], "status", []),
    # Refusals: the same exit status.
    (["create", "-f", "qcow2", "-b", "base.qcow2", "nofmt.qcow2"], "status",
     []),
    (["info", "--output=json", "missing.qcow2"], "status", []),
    (["resize", "--shrink", "base.qcow2", "32M"], "status", []),
    (["compare", "base.qcow2", "flat.qcow2"], "status", []),
    (["check", "--output=json", "flat.raw"], "status", []),
]


def is_map(v):
    return (isinstance(v, list) and v and isinstance(v[0], dict)
            and "start" in v[0] and "length" in v[0])


def map_without_offsets(v):
    """A map's extents without host offsets (where each tool's allocator
    put the clusters), neighbours that are then alike merged."""
    out = []
    for e in v:
        e = {k: x for k, x in e.items() if k != "offset"}
        last = out[-1] if out else None
        if last and all(last.get(k) == e.get(k)
                        for k in ("depth", "present", "zero", "data")) \
                and last["start"] + last["length"] == e["start"]:
            last["length"] += e["length"]
        else:
            out.append(e)
    return out


def strip_noise(v):
    if is_map(v):
        return map_without_offsets(v)
    if isinstance(v, dict):
        return {k: strip_noise(x) for k, x in v.items() if k not in NOISE}
    if isinstance(v, list):
        return [strip_noise(x) for x in v]
    return v


def run(argv, cwd):
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def fmt_of(name):
    return "raw" if name.endswith(".raw") else "qcow2"


def image_checks(name, a, b):
    """NAME in A and B: both pass qemu-img check, and hold the same."""
    for d in (a, b):
        if fmt_of(name) == "qcow2":
            r = run(["qemu-img", "check", "-q", name], d)
            if r.returncode:
                raise Failure("qemu-img check %s in %s: %s" %
                              (name, os.path.basename(d), r.stdout + r.stderr))
    r = run(["qemu-img", "compare", "-f", fmt_of(name), "-F", fmt_of(name),
             os.path.join(a, name), os.path.join(b, name)], a)
    if r.returncode:
        raise Failure("%s differs between the twins: %s" % (name, r.stdout))


def step(i, s, a, b):
    if s[0] == "io":
        for d in (a, b):
            r = run(s[1], d)
            if r.returncode:
                raise Failure("step %d: %s: %s" % (i, " ".join(s[1]),
                                                   r.stderr))
        return
    args, how, images = s
    ra = run(["qemu-img"] + args, a)
    rb = run([BLOCKPORT] + args, b)
    what = "step %d (%s)" % (i, " ".join(args))
    if ra.returncode != rb.returncode:
        raise Failure("%s: exit %d, qemu-img %d\nblockport: %s\nqemu-img: %s"
                      % (what, rb.returncode, ra.returncode,
                         rb.stdout + rb.stderr, ra.stdout + ra.stderr))
    if how == "json" and ra.returncode == 0:
        ja, jb = (strip_noise(json.loads(r.stdout)) for r in (ra, rb))
        if ja != jb:
            raise Failure("%s: JSON differs\nblockport: %s\nqemu-img: %s" %
                          (what, json.dumps(jb, sort_keys=True),
                           json.dumps(ja, sort_keys=True)))
    if how == "text" and ra.stdout != rb.stdout:
        raise Failure("%s: output differs\nblockport: %r\nqemu-img: %r" %
                      (what, rb.stdout, ra.stdout))
    for name in images:
        image_checks(name, a, b)


def case_script(_env):
    root = tempfile.mkdtemp(prefix="bp-qimg-script-")
    try:
        a, b = os.path.join(root, "qemu-img"), os.path.join(root, "blockport")
        os.mkdir(a)
        os.mkdir(b)
        for i, s in enumerate(SCRIPT, 1):
            step(i, s, a, b)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main():
    if not casetest.blockport_usable(BLOCKPORT):
        return 77
    for tool in ("qemu-img", QEMU_IO):
        if not shutil.which(tool):
            print("SKIP: no %s" % tool)
            return 77
    return casetest.run([("script", case_script)], sys.argv[1:],
                        lambda fn: fn(None))


if __name__ == "__main__":
    sys.exit(main())
