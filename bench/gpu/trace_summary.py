#!/usr/bin/env python3
"""Summarises a unimem Chrome trace (option trace_file): per device, the
count, total and longest duration of each kind of timed event (backend
calls, copies, evictions, tasks), and the time between one task's end and
the next task's start on that device, so that waits a run's makespan shows
can be put down to what the host was doing then. Usage:
trace_summary.py TRACE.json [TRACE.json ...]"""
import collections
import json
import sys


def summarise(path):
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    timed = [e for e in events if e.get("ph") == "X"]
    print(f"== {path}: {len(events)} events")
    by_kind = collections.defaultdict(list)
    for e in timed:
        by_kind[(e["pid"], e.get("cat"), e["name"])].append(e["dur"])
    print(f"  {'dev':>3} {'cat':<8} {'name':<22} {'count':>6} {'total_ms':>10} {'max_ms':>8}")
    for (pid, cat, name), durs in sorted(by_kind.items(), key=lambda kv: (kv[0][0], -sum(kv[1]))):
        print(f"  {pid:>3} {cat or '-':<8} {name:<22} {len(durs):>6} {sum(durs) / 1e3:>10.2f} {max(durs) / 1e3:>8.2f}")
    # Idle time counts between the tasks of each device's most frequent
    # task name, so that set-up tasks before the work do not count.
    names = collections.Counter((e["pid"], e["name"]) for e in timed if e.get("cat") == "task")
    main = {}
    for (pid, name), n in names.items():
        if n > names.get((pid, main.get(pid)), 0):
            main[pid] = name
    tasks = collections.defaultdict(list)
    for e in timed:
        if e.get("cat") == "task" and main.get(e["pid"]) == e["name"]:
            tasks[e["pid"]].append((e["ts"], e["ts"] + e["dur"]))
    for pid, spans in sorted(tasks.items()):
        spans.sort()
        # The device is idle where no task covers the time between the first start and the last end.
        idle, reach, longest = 0.0, spans[0][1], 0.0
        for start, end in spans[1:]:
            if start > reach:
                idle += start - reach
                longest = max(longest, start - reach)
            reach = max(reach, end)
        span = reach - spans[0][0]
        print(f"  device {pid}: {len(spans)} {main[pid]} tasks over {span / 1e3:.1f} ms, idle {idle / 1e3:.1f} ms "
              f"({100 * idle / span:.1f}%), longest idle gap {longest / 1e3:.1f} ms")


for p in sys.argv[1:]:
    summarise(p)
