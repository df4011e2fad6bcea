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
/* The median of v[0..n-1] (n at least 1), which it sorts: the middle
 * value, or for an even count the mean of the two middle values (the
 * upper one alone would lean towards the slower half of the runs). */
double tool_median(double *v, size_t n);
/* The progress of a command that may run longer than a second, on a
 * status line of stderr: "WHAT [#######.............]  35%", redrawn only when
 * the label or the whole percentage changes; nothing when stderr is not
 * a terminal. tool_progress_clear takes the line away before the command
 * prints results to the terminal; the next tool_progress draws it again.
 * One thread of a command draws. */
void tool_progress(const char *what, double fraction);
void tool_progress_clear(void);
/* Whether progress is drawn at all (stderr is a terminal): a command that
 * would start a thread only to draw it asks first. */
bool tool_progress_on(void);
/* Exit codes: 0 done; 1 a failed run or bad input data (a trace, a
 * file); 2 a bad command line (an unknown argument, a bad value, a device
 * that cannot be made or gives nothing to run on). */
#define TOOL_EXIT_FAILED 1
#define TOOL_EXIT_USAGE 2
/* Whether value can be the devices option of a configuration string that
 * the command builds: 1 to TOOL_MAX_DEVICE_LEN characters (the option's
 * room), without ',' or '=', which would end it and start another option
 * ('+' joins devices). Otherwise prints "unimem <cmd>: bad --device
 * '<value>': ..." to stderr and returns false; the command then exits
 * with TOOL_EXIT_USAGE. */
#define TOOL_MAX_DEVICE_LEN 255
bool tool_device_arg_ok(const char *cmd, const char *value);
/* Whether device dev (described by info) has at least `limit` bytes of
 * memory, as the command's --limit asks. A device holds no more than its
 * memory (um_set_memory_limit takes the capacity for a larger limit), so a
 * larger --limit would be reported as given while it does not hold:
 * refused instead. Otherwise prints "unimem <cmd>: --limit X is above
 * device N's memory (NAME has Y)" to stderr and returns false; the command
 * then exits with TOOL_EXIT_USAGE. */
bool tool_limit_fits(const char *cmd, const um_device_info *info, int dev, uint64_t limit);
/* tool_fail for um_init of a configuration made from the command line: a
 * refused option (UM_ERR_BAD_OPTION: a --device value, or UNIMEM_CONF) is
 * bad input from the user and gives TOOL_EXIT_USAGE, any other failure
 * TOOL_EXIT_FAILED. */
int tool_init_fail(const char *cmd, um_status s);
/* Writes s to f as a JSON string literal: quotes and backslashes
 * escaped, control characters as \n, \t or \u00XX (names in machine
 * files and paths may hold any of them), and bytes that are not
 * well-formed UTF-8 as \ufffd. */
void tool_json_string(FILE *f, const char *s);
/* Whether text is a whole number from min to max in decimal (no sign
 * other than '-', nothing after it), stored in *out; false otherwise. */
bool tool_parse_long(const char *text, long min, long max, long *out);
/* An argument a command does not take: -h/--help prints the usage and
 * gives 0; anything else is reported with the usage on stderr and gives 2. */
int tool_other_arg(const char *cmd, const char *arg, void (*usage)(FILE *));

#endif
