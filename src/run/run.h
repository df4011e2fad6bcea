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
 * uses are announced (UM_HINT_WILL_USE), so reclaim keeps them. A worker
 * runs its device's queue in order: it prefetches the inputs of the next
 * tasks while the current one runs, acquires the task's buffers on its
 * stream, waits for them, runs the implementation for its kind of device
 * (a GPU's launches on the stream and is waited for), releases them, and
 * learns the compute time for placement. A task that fails fails its
 * dependents without running them; the buffers stay coherent (what a
 * failed task wrote is what its buffers hold).
 *
 * One lock guards the layer's state; workers drop it while a task runs.
 * Lock order: this lock, then a buffer's.
 */
#ifndef UM_RUN_H
#define UM_RUN_H

#include "../place/place.h"

typedef struct um__run um__run;

#endif /* UM_RUN_H */
