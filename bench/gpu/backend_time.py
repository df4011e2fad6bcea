#!/usr/bin/env python3
"""Sums the spans of a unimem trace (trace_file's Chrome JSON) by name and
device: how many there were and how long they took, so that a run's time
in the driver's memory calls (the "backend ..." spans) can be set beside
its copies. Usage: backend_time.py TRACE.json"""
import collections
import json
import sys

with open(sys.argv[1]) as f:
    events = json.load(f)["traceEvents"]
count = collections.Counter()
total_us = collections.Counter()
first, last = {}, {}
for ev in events:
    if ev.get("ph") != "X":
        continue
    key = (ev.get("pid"), ev["name"])
    count[key] += 1
    total_us[key] += ev.get("dur", 0)
    first[key] = min(first.get(key, ev["ts"]), ev["ts"])
    last[key] = max(last.get(key, ev["ts"]), ev["ts"] + ev.get("dur", 0))
print("%-5s %-24s %9s %12s %10s %12s %12s" % ("pid", "span", "count", "total_ms", "us_each",
                                               "first_ms", "last_ms"))
t0 = min(first.values()) if first else 0
for key in sorted(count):
    pid, name = key
    print("%-5s %-24s %9d %12.2f %10.2f %12.2f %12.2f" % (
        pid, name, count[key], total_us[key] / 1e3, total_us[key] / count[key],
        (first[key] - t0) / 1e3, (last[key] - t0) / 1e3))
