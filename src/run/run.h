/*
 * run: multi-device execution (um_task_submit, um_task_wait,
 * um_task_cancel, um_wait_all, um_task_stats_get). Owns the tasks, the
 * dependency records of the buffers they use, and one worker thread per
 * device with its own stream.
 *
 * Dependencies come from submission order and access modes, per buffer:
 * a task that reads waits for the buffer's last writer; a task that
 * writes waits for the last writer and for every reader since. A task
 * whose dependencies are done is ready: placement (src/place) picks its
 * device then, with the load and data of that moment, and the buffers it
 * uses are announced (UM_HINT_WILL_USE), so reclaim keeps them; a task
 * that ends without acquiring them (cancelled, or not all could be had)
 * withdraws its announcements. A worker runs its device's queue in order:
 * it acquires the task's buffers on its stream, then prefetches the inputs
 * of the next tasks into the room left (a buffer listed for prefetch is
 * not destroyed until that is over), waits for the task's buffers, runs
 * the implementation for its kind of device (a GPU's launches on the
 * stream and is waited for), releases them, and learns the compute time
 * for placement. While its thread runs done callbacks a worker takes no
 * task, and one whose callback waits for a task gives its queue to the
 * other devices (or the wait fails, when only it could run that task).
 * A task that fails fails its dependents without running
 * them; the buffers stay coherent (what a failed task wrote is what its
 * buffers hold). Per finished task only its outcome byte stays, and per
 * failed one a small record its message is made from.
 *
 * One lock guards the layer's state; workers drop it while a task runs.
 * Lock order: this lock, then a buffer's.
 */
#ifndef UM_RUN_H
#define UM_RUN_H

#include "../place/place.h"

typedef struct um__run um__run;

/* Whether flops is a task's valid work estimate: a number of 0 to
 * UM_TASK_MAX_FLOPS. um_task_submit and the reader of the task trace that
 * submissions write (vsim/tasktrace.c) both ask here, so that every task
 * the runtime takes is one its trace can be read back with. */
bool um__task_flops_valid(double flops);

#endif /* UM_RUN_H */
