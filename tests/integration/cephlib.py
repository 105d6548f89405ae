# SPDX-License-Identifier: BSD-3-Clause
"""A throw-away Ceph cluster (contrib/ceph-cluster.sh) for Python tests.

    with cephlib.Cluster(tmpdir) as c:      # casetest.Skip without Ceph
        subprocess.run(["rbd", "-c", c.conf, "create", c.pool + "/t",
                        "--size", "64M"], check=True)
        c.kill_osd(); c.start_osd()

The cluster lives in DIR/ceph and is stopped (daemons killed) when the
block ends, whatever happens; os.environ["CEPH_CONF"] is set meanwhile.
Standard library only."""

import os
import shutil
import subprocess

from casetest import Failure, Skip

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "..", "..", "contrib", "ceph-cluster.sh")
NEEDED = ("ceph-mon", "ceph-osd", "ceph-authtool", "monmaptool", "ceph", "rbd")


def available():
    """None when the Ceph packages are installed, else what is missing."""
    missing = [c for c in NEEDED if shutil.which(c) is None]
    return ", ".join(missing) or None


class Cluster:
    def __init__(self, tmpdir, pool="rbd", timeout=120):
        self.dir = os.path.join(tmpdir, "ceph")
        self.conf = os.path.join(self.dir, "ceph.conf")
        self.pool = pool
        self.timeout = timeout
        self._old_conf = None

    def _script(self, cmd, *args):
        return subprocess.run(["bash", SCRIPT, cmd, self.dir] + list(args),
                              stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=self.timeout)

    def _must(self, cmd, *args):
        r = self._script(cmd, *args)
        if r.returncode != 0:
            raise Failure("ceph-cluster.sh %s: %s" % (cmd, r.stderr.strip()))

    def start(self):
        missing = available()
        if missing:
            raise Skip("Ceph packages missing (%s)" % missing)
        try:
            self._must("start", "--pool", self.pool)
        except BaseException:
            self.stop()
            raise
        self._old_conf = os.environ.get("CEPH_CONF")
        os.environ["CEPH_CONF"] = self.conf
        return self

    def stop(self):
        """Kill the daemons; the directory stays (the caller's tmpdir)."""
        if os.path.isdir(self.dir):
            self._script("stop", "--keep")
        if self._old_conf is None:
            os.environ.pop("CEPH_CONF", None)
        else:
            os.environ["CEPH_CONF"] = self._old_conf

    def usable(self):
        return self._script("status").returncode == 0

    def kill_osd(self):
        self._must("kill-osd")

    def start_osd(self):
        self._must("start-osd")

    def kill_mon(self):
        self._must("kill-mon")

    def start_mon(self):
        self._must("start-mon")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False
