#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Check that every metric a Grafana dashboard's queries use is one a
scrape of blockport serve, mount or vhost --metrics exposes, so the
dashboard cannot silently rot when a metric is renamed.

    check-dashboard.py [--only PREFIX] [--except PREFIX]... DASHBOARD.json SCRAPE.txt

--only checks just the names starting with PREFIX (the mount's rows
against a mount's scrape: blockport_mount_), --except skips those (a
serve scrape has no mount or vhost families).

Metric names are the identifiers in the queries (targets' "expr", and the
"query"/"definition" of template variables) that start with "blockport_"
or "process_"; the scrape is the Prometheus text format.  Exits 1 naming
the missing ones, or if the dashboard uses none at all."""
import json
import re
import sys

NAME = re.compile(r"\b((?:blockport|process)_[a-zA-Z0-9_]*)")


def queries(node):
    """Every query string anywhere in the dashboard."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "query", "definition") and isinstance(value, str):
                yield value
            else:
                yield from queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from queries(item)


def exposed(scrape):
    names = set()
    for line in scrape.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, 1)[0])
    return names


def main():
    args, only, skip = sys.argv[1:], None, []
    while args and args[0] in ("--only", "--except") and len(args) > 1:
        if args[0] == "--only":
            only = args[1]
        else:
            skip.append(args[1])
        args = args[2:]
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(args[0]) as f:
        dashboard = json.load(f)
    with open(args[1]) as f:
        have = exposed(f.read())
    used = set()
    for q in queries(dashboard):
        used.update(n for n in NAME.findall(q)
                    if (only is None or n.startswith(only))
                    and not any(n.startswith(x) for x in skip))
    if not used:
        print("the dashboard uses no blockport metric", file=sys.stderr)
        return 1
    missing = sorted(used - have)
    for name in missing:
        print("dashboard uses %s, which the scrape lacks" % name, file=sys.stderr)
    print("%d metric names used, %d missing" % (len(used), len(missing)))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
