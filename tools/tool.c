/* The helpers the `unimem` subcommands share (tool.h): messages, sizes,
 * the clock, arguments and the progress line. Apart from the entry point
 * (unimem.c), so that a harness can link a command without its main. */
#include "tool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int tool_fail(const char *cmd, um_status s)
{
    const char *detail = um_last_error();
    tool_progress_clear(); /* the message gets a line of its own */
    fprintf(stderr, "unimem %s: %s\n", cmd, *detail ? detail : um_strerror(s));
    return TOOL_EXIT_FAILED;
}

const char *tool_bytes(char *buf, uint64_t bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, 32, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, 32, "%.2f %s", v, units[u]);
    return buf;
}

uint64_t tool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double tool_median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

bool tool_limit_fits(const char *cmd, const um_device_info *info, int dev, uint64_t limit)
{
    if (limit <= info->capacity)
        return true;
    char l[32], c[32];
    tool_progress_clear();
    fprintf(stderr, "unimem %s: --limit %s is above device %d's memory (%s has %s)\n", cmd,
            tool_bytes(l, limit), dev, info->name, tool_bytes(c, info->capacity));
    return false;
}

bool tool_parse_long(const char *text, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max)
        return false;
    *out = v;
    return true;
}

bool tool_device_arg_ok(const char *cmd, const char *value)
{
    size_t len = strlen(value);
    if (len && len <= TOOL_MAX_DEVICE_LEN && !strpbrk(value, ",="))
        return true;
    tool_progress_clear();
    fprintf(stderr,
            "unimem %s: bad --device '%s': a value of the devices option, at most %d "
            "characters, without ',' or '=' (join devices with '+', as in sim:1G+cuda)\n",
            cmd, value, TOOL_MAX_DEVICE_LEN);
    return false;
}

int tool_init_fail(const char *cmd, um_status s)
{
    int rc = tool_fail(cmd, s);
    return s == UM_ERR_BAD_OPTION ? TOOL_EXIT_USAGE : rc;
}

/* The length of the well-formed UTF-8 sequence at p (2 to 4 bytes; lead
 * byte at least 0x80), or 0: a stray continuation byte, an overlong form,
 * a surrogate, a code point past U+10FFFF, or a sequence cut short. */
static int utf8_length(const unsigned char *p)
{
    int n = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc0 ? 2 : 0;
    if (n == 0 || p[0] == 0xc0 || p[0] == 0xc1 || p[0] > 0xf4)
        return 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0; /* the NUL that ends s stops here too */
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0) ||
        (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90))
        return 0;
    return n;
}

void tool_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p >= 0x80) {
            /* JSON is UTF-8: a byte that is not part of a well-formed
             * sequence (a file name in another encoding) becomes U+FFFD,
             * so that every JSON reader takes the output. */
            int n = utf8_length(p);
            if (n)
                fwrite(p, 1, (size_t)n, f);
            else
                fputs("\\ufffd", f);
            p += n ? n - 1 : 0;
        } else if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p == '\t')
            fputs("\\t", f);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

int tool_other_arg(const char *cmd, const char *arg, void (*print_usage)(FILE *))
{
    if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
        print_usage(stdout);
        return 0;
    }
    fprintf(stderr, "unimem %s: unknown or incomplete argument '%s'\n\n", cmd, arg);
    print_usage(stderr);
    return 2;
}

/* The status line of tool_progress: drawn only on a terminal. */
static struct {
    int tty;            /* -1: not asked yet */
    bool shown;         /* something is on the line */
    int pct;            /* the bar's percentage drawn, -1: none */
    char what[48];      /* the bar's label drawn */
} status_line = {-1, false, -1, ""};

static bool status_tty(void)
{
    if (status_line.tty < 0)
        status_line.tty = isatty(STDERR_FILENO) == 1;
    return status_line.tty;
}

void tool_progress(const char *what, double fraction)
{
    if (!status_tty())
        return;
    int pct = fraction > 0 ? (int)(fraction * 100.0) : 0;
    pct = pct > 100 ? 100 : pct;
    if (pct == status_line.pct && !strncmp(what, status_line.what, sizeof status_line.what - 1))
        return;
    status_line.pct = pct;
    snprintf(status_line.what, sizeof status_line.what, "%s", what);
    char fill[41];
    int k = pct * 40 / 100;
    memset(fill, '#', (size_t)k);
    memset(fill + k, '.', (size_t)(40 - k));
    fill[40] = '\0';
    fprintf(stderr, "\r\033[K%-28s [%s] %3d%%", status_line.what, fill, pct);
    status_line.shown = true;
    fflush(stderr);
}

bool tool_progress_on(void) { return status_tty(); }

void tool_progress_clear(void)
{
    if (status_line.shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    status_line.shown = false;
    status_line.pct = -1;
    status_line.what[0] = '\0';
}
