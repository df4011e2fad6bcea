#!/usr/bin/env python3
"""How much of the h200x8 Cholesky's gap to its lower bound is the order of
the runtime's lists, before any copy: the tiled Cholesky graph (the same
dependencies as src/vsim/dag.c) list-scheduled on P identical GPUs with
the H200's packed kernel times (src/vsim/machine.c), in the runtime's way
(a ready list; each device holds up to Q tasks and runs them in order; a
task goes to the device with the least queued work), with ready tasks
taken in the order they became ready or by bottom level.

    bench/vsim/list_schedule.py [NT [P]]     (defaults: 16 tiles a side, 8 GPUs)
"""
import heapq
import sys

NT = int(sys.argv[1]) if len(sys.argv) > 1 else 16
P = int(sys.argv[2]) if len(sys.argv) > 2 else 8
# Packed times at tile 8192, ms (POTRF alone: it is not packed).
GEMM, TRSM, SYRK, POTRF = 20.9372, 13.2626, 10.4205, 7.6912

tasks = {}   # name -> (ms, deps)
order = []   # submission order
last = {}    # tile -> its last writer


def add(name, ms, deps):
    tasks[name] = (ms, [d for d in deps if d])
    order.append(name)


for k in range(NT):
    add(("potrf", k), POTRF, [last.get((k, k))])
    last[(k, k)] = ("potrf", k)
    for i in range(k + 1, NT):
        add(("trsm", i, k), TRSM, [last.get((i, k)), ("potrf", k)])
        last[(i, k)] = ("trsm", i, k)
    for i in range(k + 1, NT):
        add(("syrk", i, k), SYRK, [last.get((i, i)), ("trsm", i, k)])
        last[(i, i)] = ("syrk", i, k)
        for j in range(k + 1, i):
            add(("gemm", i, j, k), GEMM, [last.get((i, j)), ("trsm", i, k), ("trsm", j, k)])
            last[(i, j)] = ("gemm", i, j, k)

succ = {n: [] for n in tasks}
for n, (_, deps) in tasks.items():
    for d in deps:
        succ[d].append(n)
level = {}
for n in reversed(order):
    level[n] = tasks[n][0] + max((level[s] for s in succ[n]), default=0)
work = sum(ms for ms, _ in tasks.values())
bound = max(work / P, max(level.values()))


def schedule(q, by_level):
    waiting = {n: len(deps) for n, (_, deps) in tasks.items()}
    ready, count = [], [0]

    def make_ready(n):
        count[0] += 1
        heapq.heappush(ready, ((-level[n] if by_level else 0), count[0], n))

    for n in order:
        if not waiting[n]:
            make_ready(n)
    queue = [[] for _ in range(P)]
    ends, now, done = [], 0.0, 0

    def dispatch():
        while ready:
            room = [d for d in range(P) if len(queue[d]) < q]
            if not room:
                return
            d = min(room, key=lambda d: sum(tasks[x][0] for x in queue[d]))
            n = heapq.heappop(ready)[2]
            queue[d].append(n)
            if len(queue[d]) == 1:
                heapq.heappush(ends, (now + tasks[n][0], d))

    dispatch()
    while done < len(tasks):
        now, d = heapq.heappop(ends)
        n = queue[d].pop(0)
        done += 1
        if queue[d]:
            heapq.heappush(ends, (now + tasks[queue[d][0]][0], d))
        for s in succ[n]:
            waiting[s] -= 1
            if not waiting[s]:
                make_ready(s)
        dispatch()
    return now


print("%d tasks on %d GPUs: work/P %.4f s, path %.4f s" % (len(tasks), P, work / P / 1e3,
                                                            max(level.values()) / 1e3))
for q in (1, 2, 4, 7):
    for by_level in (False, True):
        m = schedule(q, by_level)
        print("held %d, %-13s makespan %.4f s  %.4f of the bound" %
              (q, "bottom level" if by_level else "ready order", m / 1e3, m / bound))
