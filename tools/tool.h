/* The `unimem` command: one function per subcommand, and helpers they share.
 * Tools use only the public API (unimem.h). */
#ifndef UM_TOOL_H
#define UM_TOOL_H

#include "unimem.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

int um_cmd_info(int argc, char **argv);
int um_cmd_replay(int argc, char **argv);
int um_cmd_bench(int argc, char **argv);
int um_cmd_bench_copy(int argc, char **argv);
int um_cmd_bench_oversub(int argc, char **argv);
int um_cmd_bench_gpu(int argc, char **argv);
int um_cmd_demo(int argc, char **argv);
int um_cmd_sim(int argc, char **argv);
int um_cmd_timeline(int argc, char **argv);

/* Prints "unimem <cmd>: <status name>: <um_last_error()>" to stderr and
 * returns the exit code for a failed call (1). */
int tool_fail(const char *cmd, um_status s);
/* "1.50 GiB" into buf (at least 32 bytes). */
const char *tool_bytes(char *buf, uint64_t bytes);
uint64_t tool_now_ns(void);
/* On a terminal, replaces the status line on stderr with the text (what a
 * long command is doing now); NULL clears it. Nothing when piped. */
void tool_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* An argument a command does not take: -h/--help prints the usage and
 * gives 0; anything else is reported with the usage on stderr and gives 2. */
int tool_other_arg(const char *cmd, const char *arg, void (*usage)(FILE *));

#endif
