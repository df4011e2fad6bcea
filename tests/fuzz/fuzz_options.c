/*
 * fuzz_options: the bytes are an option string ("key=value,...").
 *
 * 1. um_parse_size on the whole string and on every value in it, against
 *    a reference parser written here from the documented grammar (trimmed
 *    digits, an optional fraction of at most 32 places, an optional
 *    K/M/G/T unit with an optional B or iB, or a bare B; the exact floor of
 *    the value times the unit; anything above SIZE_MAX is an error), and
 *    the round trip of what it accepts ("%zu", and "%zu<unit>" where the
 *    value is a multiple of the unit).
 * 2. The internal parser um__options_apply (src/base/options.h), which
 *    needs no device: a failure is UM_ERR_BAD_OPTION with a message that
 *    starts with the status and names the source, and leaves the options
 *    unchanged; a success is idempotent and every option, formatted by
 *    um__options_format and parsed back (alone, and all of them in one
 *    string), gives the same value.
 * 3. um_init: a string the parser rejects must fail in um_init with the
 *    same status and message. One it accepts is made cheap and harmless
 *    first: fixed keys appended (the last value wins) keep devices to a
 *    few small sim devices and the host pool small, pageable and with no
 *    file or driver behind it (string options other than devices and
 *    spill_dir emptied, link_cache=none, links=model; spill_dir is only
 *    stat()ed by um_init). Then um_init either fails with a message that
 *    names its status (never UM_ERR_INTERNAL), or succeeds with the devices
 *    asked for and um_option_current equal to the parser's view of the
 *    string; um_shutdown must then free everything (the leak check).
 */
#include "fuzz_common.h"

#include "base/options.h"

#include <limits.h>

#define OPT_MAX_INPUT 4096
/* What a device list may ask for before the harness replaces it. */
#define SAFE_SIM_DEVICES 4
#define SAFE_SIM_BYTES ((size_t)32 << 20)
#define SAFE_SIM_TOTAL ((size_t)64 << 20)
#define SAFE_HOST_BYTES ((size_t)64 << 20)

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* um_init reads UNIMEM_CONF first; the harness owns the whole string. */
    unsetenv("UNIMEM_CONF");
    unsetenv("UNIMEM_SHOW_STATS");
    return 0;
}

/* ------------------------------------------------------------ sizes */

static bool ref_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static bool ref_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* The reference: the value of text[0..len) as a size, or false. */
static bool ref_parse_size(const char *text, size_t len, size_t *out)
{
    const char *p = text, *end = text + len;
    while (p < end && ref_space(*p))
        p++;
    while (end > p && ref_space(end[-1]))
        end--;
    if (p == end || !ref_digit(*p))
        return false;
    unsigned __int128 whole = 0;
    bool huge = false;
    for (; p < end && ref_digit(*p); p++) {
        whole = whole * 10 + (unsigned)(*p - '0');
        if (whole > UINT64_MAX)
            huge = true, whole = (unsigned __int128)UINT64_MAX + 1;
    }
    unsigned char frac[40];
    size_t nfrac = 0;
    if (p < end && *p == '.') {
        p++;
        if (p == end || !ref_digit(*p))
            return false;
        for (; p < end && ref_digit(*p); p++) {
            if (nfrac == 32)
                return false;
            frac[nfrac++] = (unsigned char)(*p - '0');
        }
    }
    while (p < end && ref_space(*p))
        p++;
    unsigned shift = 0;
    if (p < end) {
        const char *units = "kKmMgGtT";
        const char *u = *p ? strchr(units, *p) : NULL;
        if (u) {
            shift = 10u * (unsigned)((u - units) / 2 + 1);
            p++;
            if (end - p == 2 && (p[0] == 'i' || p[0] == 'I') && (p[1] == 'b' || p[1] == 'B'))
                p += 2;
            else if (end - p == 1 && (p[0] == 'b' || p[0] == 'B'))
                p++;
        } else if (*p == 'b' || *p == 'B') {
            p++;
        }
        if (p != end)
            return false;
    }
    if (huge)
        return false;
    bool frac_nonzero = false;
    for (size_t i = 0; i < nfrac; i++)
        frac_nonzero |= frac[i] != 0;
    /* Bytes have no fraction. */
    if (!shift && frac_nonzero)
        return false;
    /* floor(0.d1..dn * 2^shift): the decimal digits times 2^shift, the
     * carry out of the top digit is the integer part. */
    uint64_t carry = 0, m = (uint64_t)1 << shift;
    for (size_t i = nfrac; i-- > 0;) {
        uint64_t t = (uint64_t)frac[i] * m + carry;
        carry = t / 10;
    }
    unsigned __int128 total = (whole << shift) + carry;
    if (total > SIZE_MAX)
        return false;
    /* More than 0 never rounds to 0 bytes. */
    if (total == 0 && (whole || frac_nonzero))
        return false;
    *out = (size_t)total;
    return true;
}

/* um_parse_size on a NUL-terminated copy of text[0..len). */
static void check_size(const char *text, size_t len)
{
    char buf[OPT_MAX_INPUT + 1];
    if (len > OPT_MAX_INPUT)
        len = OPT_MAX_INPUT;
    memcpy(buf, text, len);
    buf[len] = '\0';
    len = strlen(buf);
    size_t got = 0, want = 0, internal = 0;
    const char *why = NULL;
    um__clear_error();
    um_status st = um_parse_size(buf, &got);
    bool ref = ref_parse_size(buf, len, &want);
    bool in = um__parse_size(buf, len, &internal, &why);
    FUZZ_CHECK((st == UM_OK) == ref, "um_parse_size('%s') is %s, the reference says %s (%zu)", buf,
               um_status_name(st), ref ? "valid" : "invalid", want);
    FUZZ_CHECK(in == (st == UM_OK), "um__parse_size and um_parse_size disagree on '%s'", buf);
    if (st != UM_OK) {
        FUZZ_CHECK(st == UM_ERR_INVALID, "um_parse_size('%s') failed with %s", buf,
                   um_status_name(st));
        FUZZ_CHECK(fuzz_error_names(st), "no message for the failure of um_parse_size('%s')", buf);
        FUZZ_CHECK(why && *why, "um__parse_size('%s') failed without saying why", buf);
        return;
    }
    FUZZ_CHECK(got == want && got == internal, "um_parse_size('%s') = %zu, reference %zu", buf, got,
               want);
    /* Round trips: plain bytes, then every unit the value is a multiple of. */
    char again[64];
    size_t back = 0;
    snprintf(again, sizeof again, "%zu", got);
    FUZZ_CHECK(um_parse_size(again, &back) == UM_OK && back == got, "'%s' does not parse back",
               again);
    static const char *const names[] = {"K", "MiB", "g", "TB"};
    static const char *const spaced[] = {" KB", "M", "GiB", "t"};
    for (unsigned k = 1; k <= 4; k++) {
        size_t unit = (size_t)1 << (10 * k);
        if (got % unit)
            break;
        const char *suffix = (got / unit) % 2 ? names[k - 1] : spaced[k - 1];
        snprintf(again, sizeof again, "%zu%s", got / unit, suffix);
        back = 0;
        FUZZ_CHECK(um_parse_size(again, &back) == UM_OK && back == got,
                   "'%s' parses to %zu, not %zu", again, back, got);
    }
}

/* ------------------------------------------------------------ options */

/* o and p hold the same value of every option (compared as the parser's
 * own text, so struct padding plays no part). */
static int first_difference(const um__options *o, const um__options *p)
{
    char a[300], b[300];
    for (int i = 0; i < um_option_count(); i++) {
        FUZZ_CHECK(um__options_format(o, i, a, sizeof a) == UM_OK, "option %d does not format", i);
        FUZZ_CHECK(um__options_format(p, i, b, sizeof b) == UM_OK, "option %d does not format", i);
        if (strcmp(a, b) != 0)
            return i;
    }
    return -1;
}

static const char *option_name(int i)
{
    um_option_info info;
    return um_option_get(i, &info) == UM_OK ? info.name : "?";
}

/* Every value of o formatted and parsed back: alone, then all at once. */
static void check_round_trip(const um__options *o)
{
    static char all[64 * 300];
    size_t used = 0;
    all[0] = '\0';
    for (int i = 0; i < um_option_count(); i++) {
        char value[300], one[400];
        FUZZ_CHECK(um__options_format(o, i, value, sizeof value) == UM_OK, "format %d", i);
        snprintf(one, sizeof one, "%s=%s", option_name(i), value);
        um__options p;
        um__options_defaults(&p);
        um_status st = um__options_apply(&p, one, "round trip");
        FUZZ_CHECK(st == UM_OK, "'%s' (formatted) does not parse back", one);
        char value2[300];
        FUZZ_CHECK(um__options_format(&p, i, value2, sizeof value2) == UM_OK, "format %d", i);
        FUZZ_CHECK(strcmp(value, value2) == 0, "'%s' parses back as '%s'", one, value2);
        int w = snprintf(all + used, sizeof all - used, "%s%s", i ? "," : "", one);
        FUZZ_CHECK(w > 0 && (size_t)w < sizeof all - used, "round-trip string too long");
        used += (size_t)w;
    }
    um__options p;
    um__options_defaults(&p);
    FUZZ_CHECK(um__options_apply(&p, all, "round trip") == UM_OK, "'%s' does not parse back", all);
    int d = first_difference(o, &p);
    FUZZ_CHECK(d < 0, "option %s differs after the round trip of '%s'", d >= 0 ? option_name(d) : "",
               all);
}

/* Each value of conf (after '=', up to the next ',') as a size. */
static void check_values_as_sizes(const char *conf)
{
    for (const char *p = strchr(conf, '='); p; p = strchr(p + 1, '=')) {
        const char *v = p + 1;
        size_t n = strcspn(v, ",");
        check_size(v, n);
    }
}

/* ------------------------------------------------------------ devices */

typedef enum devices_verdict {
    DEVICES_SMALL,   /* only small sim devices (or none): um_init may make them */
    DEVICES_INVALID, /* an entry um_init rejects before making anything */
    DEVICES_UNSAFE   /* anything else (GPUs, large devices): replaced */
} devices_verdict;

/* A mirror of context.c's device-list grammar, on the side of caution:
 * it says SMALL only for a list of sim:SIZE / sim:NxSIZE entries that
 * um_parse_size accepts and that stay small, INVALID only where the
 * library must fail (an empty entry, an entry that is neither sim:... nor
 * cuda..., a sim entry whose count or size does not parse). *ndev and
 * sizes[] get the devices of a SMALL list. */
static devices_verdict judge_devices(const char *list, int *ndev, size_t *sizes)
{
    const char *end = list + strlen(list);
    const char *a = list;
    *ndev = 0;
    while (a < end && (*a == ' ' || *a == '\t' || *a == '\n' || *a == '\r'))
        a++;
    if (a == end)
        return DEVICES_SMALL;
    devices_verdict v = DEVICES_SMALL;
    size_t total = 0;
    int entries = 0;
    for (const char *p = list; p <= end;) {
        const char *e = p;
        while (e < end && *e != ',' && *e != '+')
            e++;
        const char *s = p, *t = e;
        while (s < t && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r'))
            s++;
        while (t > s && (t[-1] == ' ' || t[-1] == '\t' || t[-1] == '\n' || t[-1] == '\r'))
            t--;
        size_t len = (size_t)(t - s);
        p = e + 1;
        if (len == 0 || ++entries > 63)
            return DEVICES_INVALID;
        if ((len == 4 && !memcmp(s, "cuda", 4)) || (len >= 5 && !memcmp(s, "cuda:", 5))) {
            v = DEVICES_UNSAFE;
            continue;
        }
        if (len < 4 || memcmp(s, "sim:", 4) != 0)
            return DEVICES_INVALID;
        const char *q = s + 4;
        const char *x = memchr(q, 'x', (size_t)(t - q));
        if (!x)
            x = memchr(q, 'X', (size_t)(t - q));
        long count = 1;
        if (x) {
            if (x == q)
                return DEVICES_INVALID;
            count = 0;
            for (const char *c = q; c < x; c++) {
                if (*c < '0' || *c > '9')
                    return DEVICES_INVALID;
                if (count < 1000)
                    count = count * 10 + (*c - '0');
            }
            q = x + 1;
        }
        if (count < 1 || count > 63)
            return DEVICES_INVALID;
        char size_text[64];
        if ((size_t)(t - q) >= sizeof size_text || t == q)
            return DEVICES_INVALID;
        memcpy(size_text, q, (size_t)(t - q));
        size_text[t - q] = '\0';
        size_t size;
        if (um_parse_size(size_text, &size) != UM_OK || size == 0)
            return DEVICES_INVALID;
        if (v != DEVICES_SMALL)
            continue;
        if (size > SAFE_SIM_BYTES || *ndev + count > SAFE_SIM_DEVICES ||
            total + (size_t)count * size > SAFE_SIM_TOTAL) {
            v = DEVICES_UNSAFE;
            continue;
        }
        for (long k = 0; k < count; k++)
            sizes[(*ndev)++] = size;
        total += (size_t)count * size;
    }
    return v;
}

/* ------------------------------------------------------------ um_init */

static void try_init(const char *conf, const um__options *parsed)
{
    /* The safe string: conf, then keys that neutralise what is costly or
     * reaches outside the process. */
    static char safe[OPT_MAX_INPUT + 4096];
    int ndev = 0;
    size_t sizes[SAFE_SIM_DEVICES];
    devices_verdict dv = judge_devices(parsed->devices, &ndev, sizes);
    size_t n = (size_t)snprintf(safe, sizeof safe, "%s,log_level=error,host_memory=pageable,"
                                                   "links=model,copy_threads=1",
                                conf);
    for (int i = 0; i < um_option_count(); i++) {
        um_option_info info;
        if (um_option_get(i, &info) != UM_OK || info.type != UM_OPT_STRING ||
            !strcmp(info.name, "devices") || !strcmp(info.name, "spill_dir"))
            continue;
        n += (size_t)snprintf(safe + n, sizeof safe - n, ",%s=%s", info.name,
                              strcmp(info.name, "link_cache") ? "" : "none");
    }
    if (parsed->host_capacity == 0 || parsed->host_capacity > SAFE_HOST_BYTES)
        n += (size_t)snprintf(safe + n, sizeof safe - n, ",host_capacity=16M");
    if (dv == DEVICES_UNSAFE) {
        n += (size_t)snprintf(safe + n, sizeof safe - n, ",devices=sim:16M+sim:8M");
        ndev = 2;
        sizes[0] = (size_t)16 << 20;
        sizes[1] = (size_t)8 << 20;
        dv = DEVICES_SMALL;
    }
    FUZZ_CHECK(n < sizeof safe, "safe string too long");

    /* The appended keys change only themselves. */
    um__options final;
    um__options_defaults(&final);
    um_status st = um__options_apply(&final, safe, "um_init");
    FUZZ_CHECK(st == UM_OK, "'%s' parsed, but not with keys appended: '%s'", conf, safe);
    for (int i = 0; i < um_option_count(); i++) {
        const char *name = option_name(i);
        if (strstr(safe + strlen(conf), name))
            continue; /* overridden */
        char a[300], b[300];
        um__options_format(parsed, i, a, sizeof a);
        um__options_format(&final, i, b, sizeof b);
        FUZZ_CHECK(strcmp(a, b) == 0, "option %s is '%s' alone but '%s' with keys appended", name,
                   a, b);
    }

    um_context *ctx = NULL;
    um__clear_error();
    st = um_init(safe, &ctx);
    if (st != UM_OK) {
        FUZZ_CHECK(ctx == NULL, "um_init failed but set the context");
        FUZZ_CHECK(st != UM_ERR_INTERNAL, "um_init('%s'): internal error", safe);
        FUZZ_CHECK(fuzz_error_names(st), "um_init('%s') failed with %s and no message", safe,
                   um_status_name(st));
        return;
    }
    FUZZ_CHECK(ctx != NULL, "um_init succeeded without a context");
    FUZZ_CHECK(dv != DEVICES_INVALID, "um_init accepted devices='%s', which the harness's mirror "
                                      "of the grammar rejects", final.devices);
    FUZZ_CHECK(um_device_count(ctx) == 1 + ndev, "um_init('%s'): %d devices, expected %d", safe,
               um_device_count(ctx), 1 + ndev);
    for (int d = 0; d < um_device_count(ctx); d++) {
        um_device_info info;
        FUZZ_CHECK(um_device_info_get(ctx, d, &info) == UM_OK, "device %d info", d);
        FUZZ_CHECK(info.index == d, "device %d says it is %d", d, info.index);
        size_t g = d ? final.sim_granularity : final.host_granularity;
        FUZZ_CHECK(info.granularity == g, "device %d: granularity %zu, asked %zu", d,
                   info.granularity, g);
        if (d) {
            FUZZ_CHECK(info.kind == UM_DEVICE_SIM, "device %d is not a sim device", d);
            FUZZ_CHECK(info.capacity == (sizes[d - 1] & ~(g - 1)),
                       "device %d: capacity %zu for sim:%zu with granularity %zu", d,
                       info.capacity, sizes[d - 1], g);
        } else {
            FUZZ_CHECK(info.kind == UM_DEVICE_HOST, "device 0 is not the host");
        }
        /* A limit above the capacity is the capacity. */
        size_t want_limit = final.memory_limit && final.memory_limit < info.capacity
                                ? final.memory_limit
                                : info.capacity;
        FUZZ_CHECK(info.memory_limit == want_limit,
                   "device %d: memory limit %zu (option %zu, capacity %zu)", d, info.memory_limit,
                   final.memory_limit, info.capacity);
        um_stats s;
        FUZZ_CHECK(um_stats_get(ctx, d, &s) == UM_OK, "stats of device %d", d);
        FUZZ_CHECK(s.active_bytes == 0 && s.active_blocks == 0 &&
                       s.reserved_bytes <= info.memory_limit,
                   "device %d: a new context holds %zu bytes in %llu blocks, %zu reserved", d,
                   s.active_bytes, (unsigned long long)s.active_blocks, s.reserved_bytes);
    }
    for (int i = 0; i < um_option_count(); i++) {
        char a[300], b[300];
        FUZZ_CHECK(um_option_current(ctx, i, a, sizeof a) == UM_OK, "um_option_current %d", i);
        um__options_format(&final, i, b, sizeof b);
        FUZZ_CHECK(strcmp(a, b) == 0, "option %s: context has '%s', the parser '%s'",
                   option_name(i), a, b);
    }
    um_shutdown(ctx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > OPT_MAX_INPUT)
        return -1; /* not added to the corpus */
    char conf[OPT_MAX_INPUT + 1];
    memcpy(conf, data, size);
    conf[size] = '\0'; /* an embedded NUL ends the string, as it would in C */

    check_size(conf, strlen(conf));
    check_values_as_sizes(conf);

    um__options base, o;
    um__options_defaults(&base);
    o = base;
    um__clear_error();
    um_status st = um__options_apply(&o, conf, "um_init");
    if (st != UM_OK) {
        char msg[600];
        FUZZ_CHECK(st == UM_ERR_BAD_OPTION, "'%s' failed with %s", conf, um_status_name(st));
        FUZZ_CHECK(fuzz_error_names(st), "'%s' failed with no message", conf);
        FUZZ_CHECK(strstr(um_last_error(), "um_init") != NULL,
                   "the message for '%s' does not name its source", conf);
        int d = first_difference(&o, &base);
        FUZZ_CHECK(d < 0, "a failed parse of '%s' changed option %s", conf, option_name(d));
        snprintf(msg, sizeof msg, "%s", um_last_error());
        /* um_init parses first: the same failure, and nothing made. */
        um_context *ctx = (um_context *)&o;
        um__clear_error();
        um_status st2 = um_init(conf, &ctx);
        FUZZ_CHECK(st2 == st && ctx == NULL, "um_init('%s') gave %s, the parser %s", conf,
                   um_status_name(st2), um_status_name(st));
        FUZZ_CHECK(strcmp(msg, um_last_error()) == 0,
                   "um_init('%s') says '%s', the parser '%s'", conf, um_last_error(), msg);
        return 0;
    }
    /* Applying the same string again changes nothing. */
    um__options again = o;
    FUZZ_CHECK(um__options_apply(&again, conf, "um_init") == UM_OK, "second parse of '%s'", conf);
    int d = first_difference(&o, &again);
    FUZZ_CHECK(d < 0, "a second parse of '%s' changed option %s", conf, option_name(d));
    check_round_trip(&o);
    try_init(conf, &o);
    return 0;
}
