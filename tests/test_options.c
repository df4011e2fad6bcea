/* Tests of the option table and parser (src/base/options.c): every option
 * type accepted and rejected, size suffixes and overflow, the messages of
 * failures, the devices list with commas, and UNIMEM_CONF against the conf
 * string of um_init. */
#include "base/options.h"
#include "core/core.h"
#include "harness.h"

#include <stdlib.h>
#include <string.h>

static void test_table(void)
{
    CHECK_EQ(um_option_count(), 39);
    um_option_info info;
    for (int i = 0; i < um_option_count(); i++) {
        CHECK_OK(um_option_get(i, &info));
        CHECK(info.name && *info.name);
        CHECK(info.doc && *info.doc);
        CHECK(info.default_value != NULL);
        /* Names are unique. */
        for (int j = 0; j < i; j++) {
            um_option_info other;
            CHECK_OK(um_option_get(j, &other));
            CHECK(strcmp(other.name, info.name) != 0);
        }
        /* Every default parses as a value of its own option. */
        char conf[128];
        snprintf(conf, sizeof conf, "%s=%s", info.name, info.default_value);
        um__options o;
        um__options_defaults(&o);
        um__options before = o;
        CHECK_OK(um__options_apply(&o, conf, "test"));
        CHECK(memcmp(&o, &before, sizeof o) == 0);
    }
    CHECK_STATUS(um_option_get(-1, &info), UM_ERR_INVALID);
    CHECK_STATUS(um_option_get(um_option_count(), &info), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("index 39", NULL, NULL);
    CHECK_STATUS(um_option_get(0, NULL), UM_ERR_INVALID);

    CHECK_OK(um_option_get(0, &info));
    CHECK(strcmp(info.name, "log_level") == 0);
    CHECK_EQ(info.type, UM_OPT_ENUM);
    CHECK(strcmp(info.default_value, "warn") == 0);
}

static void test_defaults(void)
{
    um__options o;
    memset(&o, 0x5a, sizeof o);
    um__options_defaults(&o);
    CHECK_EQ(o.log_level, UM_LOG_WARN);
    CHECK_EQ(o.devices[0], '\0');
    CHECK_EQ(o.allocator, UM_ALLOCATOR_POOL);
    CHECK_EQ(o.memory_limit, 0);
    CHECK_EQ(o.cache_limit, SIZE_MAX);
    CHECK_EQ(o.sim_granularity, 2u << 20);
    CHECK_EQ(o.host_granularity, 2u << 20);
    CHECK_EQ(o.host_capacity, 0);
    CHECK_EQ(o.thread_cache, 1);
    CHECK_EQ(o.va_factor, 4);
}

static void test_parse_size(void)
{
    static const struct {
        const char *text;
        unsigned long long bytes;
    } good[] = {
        {"0", 0},
        {"1", 1},
        {"4096", 4096},
        {"100B", 100},
        {"100b", 100},
        {"1K", 1024},
        {"1k", 1024},
        {"1KB", 1024},
        {"1KiB", 1024},
        {"1kib", 1024},
        {"1KIB", 1024},
        {"64M", 64ull << 20},
        {"64m", 64ull << 20},
        {"64MB", 64ull << 20},
        {"64MiB", 64ull << 20},
        {"2G", 2ull << 30},
        {"2GiB", 2ull << 30},
        {"3T", 3ull << 40},
        {"3tb", 3ull << 40},
        {"1.5G", 1610612736ull},
        {"1.5GiB", 1610612736ull},
        {"0.5K", 512},
        {"1.1K", 1126}, /* 1126.4 rounded down */
        {"1.0", 1},     /* a zero fraction is a whole number of bytes */
        {"2.000B", 2},
        {"0.0", 0},
        {"0.000K", 0},
        {"0.001K", 1}, /* 1.024 bytes */
        {"  4K  ", 4096},
        {"4 K", 4096},
        {"\t8M\n", 8ull << 20},
        {"16777215T", 16777215ull << 40},
        {"18446744073709551615", 18446744073709551615ull},
        {"15.99999999999999999999999999999T", 17592186044415ull},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        size_t out = 12345;
        CHECK_OK(um_parse_size(good[i].text, &out));
        harness_checks++;
        if (out != good[i].bytes)
            harness_report(__FILE__, __LINE__, "um_parse_size(\"%s\") = %zu, expected %llu",
                           good[i].text, out, good[i].bytes);
    }
    static const char *const bad[] = {
        "",
        "   ",
        "-1",
        "-0",
        "K",
        "1.K",
        ".5K",
        "1.5.5",
        "12Q",
        "1KiBx",
        "1iB",
        "1 K B",
        "1KK",
        "0x10",
        "+5",
        "1E",
        "16777216T",
        "1e3",
        "1,5G",
        "1_000",
        "abc",
        "18446744073709551616",
        "99999999999999999999999",
        "18014398509481984K",
        "1.000000000000000000000000000000001K", /* 33 decimals */
        "1.5",                                  /* fractions of a byte */
        "0.5",
        "1.999B",
        "0.0001K", /* 0.1024 bytes: not 0, yet rounds to 0 */
        "0.0000001K",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t out = 777;
        um__clear_error();
        CHECK_STATUS(um_parse_size(bad[i], &out), UM_ERR_INVALID);
        CHECK_EQ(out, 777);
        CHECK(strstr(um_last_error(), "UM_ERR_INVALID: size '") == um_last_error());
    }
    size_t out;
    CHECK_STATUS(um_parse_size(NULL, &out), UM_ERR_INVALID);
    CHECK_STATUS(um_parse_size("1K", NULL), UM_ERR_INVALID);
    CHECK_STATUS(um_parse_size("16777216T", &out), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("16777216T", "overflows", NULL);
    CHECK_STATUS(um_parse_size("-5M", &out), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("negative", NULL, NULL);
}

/* Random decimal sizes against a reference computed with 128-bit integers:
 * floor((whole * 10^n + frac) * 2^shift / 10^n). */
static void test_parse_size_random(void)
{
    uint64_t rng = harness_seed("test_options.parse_size");
    static const char *const units[] = {"", "B", "K", "KiB", "m", "MB", "G", "gib", "T", "TiB"};
    static const unsigned shifts[] = {0, 0, 10, 10, 20, 20, 30, 30, 40, 40};
    for (int iter = 0; iter < 20000; iter++) {
        unsigned u = (unsigned)(harness_rand(&rng) % 10);
        uint64_t whole = harness_rand(&rng) % (iter % 2 ? 100000ull : 1000000000000ull);
        unsigned n = (unsigned)(harness_rand(&rng) % 10); /* decimals */
        uint64_t pow10 = 1;
        for (unsigned i = 0; i < n; i++)
            pow10 *= 10;
        uint64_t frac = n ? harness_rand(&rng) % pow10 : 0;
        char text[80];
        if (n)
            snprintf(text, sizeof text, "%llu.%0*llu%s", (unsigned long long)whole, (int)n,
                     (unsigned long long)frac, units[u]);
        else
            snprintf(text, sizeof text, "%llu%s", (unsigned long long)whole, units[u]);
        unsigned __int128 num = ((unsigned __int128)whole * pow10 + frac) << shifts[u];
        unsigned __int128 want = num / pow10;
        size_t out = 0;
        um_status st = um_parse_size(text, &out);
        /* Refused: a fraction of a byte, a value that rounds to 0 bytes
         * but is not 0, and one above SIZE_MAX. */
        if ((shifts[u] == 0 && frac) || (want == 0 && num) || want > (unsigned __int128)SIZE_MAX) {
            CHECK_STATUS(st, UM_ERR_INVALID);
        } else {
            CHECK_OK(st);
            harness_checks++;
            if ((unsigned __int128)out != want)
                harness_report(__FILE__, __LINE__, "um_parse_size(\"%s\") = %zu, expected %llu",
                               text, out, (unsigned long long)want);
        }
    }
}

static void test_types(void)
{
    um__options o;
    um__options_defaults(&o);

    /* BOOL */
    static const struct {
        const char *v;
        int want;
    } bools[] = {{"1", 1},  {"0", 0},   {"true", 1}, {"false", 0}, {"yes", 1}, {"no", 0},
                 {"on", 1}, {"off", 0}, {"TRUE", 1}, {"Off", 0},   {"Yes", 1}};
    for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++) {
        char conf[64];
        o.thread_cache = !bools[i].want;
        snprintf(conf, sizeof conf, "thread_cache=%s", bools[i].v);
        CHECK_OK(um__options_apply(&o, conf, "test"));
        CHECK_EQ(o.thread_cache, bools[i].want);
    }
    static const char *const bad_bools[] = {"2", "maybe", "", "tru", "yess", "-1", "o"};
    for (size_t i = 0; i < sizeof bad_bools / sizeof bad_bools[0]; i++) {
        char conf[64];
        snprintf(conf, sizeof conf, "thread_cache=%s", bad_bools[i]);
        CHECK_STATUS(um__options_apply(&o, conf, "test"), UM_ERR_BAD_OPTION);
        CHECK_ERROR_MENTIONS("'thread_cache'", "boolean", "in test");
    }
    CHECK_STATUS(um__options_apply(&o, "thread_cache=maybe", "um_init"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'maybe'", "in um_init", NULL);

    /* INT with its range */
    CHECK_OK(um__options_apply(&o, "va_factor=1", "test"));
    CHECK_EQ(o.va_factor, 1);
    CHECK_OK(um__options_apply(&o, "va_factor=64", "test"));
    CHECK_EQ(o.va_factor, 64);
    CHECK_OK(um__options_apply(&o, "va_factor=007", "test"));
    CHECK_EQ(o.va_factor, 7);
    static const char *const bad_ints[] = {"0",   "65",  "-3", "4x", "",    "99999999999999999999",
                                           "1.5", "0x4", "+4", "-",  " 4 4"};
    for (size_t i = 0; i < sizeof bad_ints / sizeof bad_ints[0]; i++) {
        char conf[64];
        snprintf(conf, sizeof conf, "va_factor=%s", bad_ints[i]);
        CHECK_STATUS(um__options_apply(&o, conf, "test"), UM_ERR_BAD_OPTION);
        CHECK_ERROR_MENTIONS("'va_factor'", "integer from 1 to 64", NULL);
        CHECK_EQ(o.va_factor, 7);
    }
    CHECK_STATUS(um__options_apply(&o, "va_factor=65", "test"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'65'", NULL, NULL);

    /* ENUM: exactly the words of the doc line, in order. */
    static const char *const levels[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        char conf[64];
        snprintf(conf, sizeof conf, "log_level=%s", levels[i]);
        CHECK_OK(um__options_apply(&o, conf, "test"));
        CHECK_EQ(o.log_level, i);
    }
    CHECK_EQ(UM_LOG_DEBUG, 3);
    static const char *const allocators[] = {"pool", "direct", "bufcache"};
    for (int i = 0; i < 3; i++) {
        char conf[64];
        snprintf(conf, sizeof conf, "allocator=%s", allocators[i]);
        CHECK_OK(um__options_apply(&o, conf, "test"));
        CHECK_EQ(o.allocator, i);
        CHECK(strcmp(um__allocator_name(o.allocator), allocators[i]) == 0);
    }
    CHECK(strcmp(um__allocator_name(7), "unknown") == 0);
    static const char *const bad_enums[] = {"slab", "", "Pool", "poo", "pool|direct", "pool:"};
    for (size_t i = 0; i < sizeof bad_enums / sizeof bad_enums[0]; i++) {
        char conf[64];
        snprintf(conf, sizeof conf, "allocator=%s", bad_enums[i]);
        CHECK_STATUS(um__options_apply(&o, conf, "test"), UM_ERR_BAD_OPTION);
        CHECK_ERROR_MENTIONS("'allocator'", "pool|direct|bufcache", NULL);
        CHECK_EQ(o.allocator, UM_ALLOCATOR_BUFCACHE);
    }
    CHECK_STATUS(um__options_apply(&o, "log_level=verbose", "test"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'verbose'", "error|warn|info|debug", NULL);

    /* SIZE */
    CHECK_OK(um__options_apply(&o, "memory_limit=1.5G,cache_limit=64MiB", "test"));
    CHECK_EQ(o.memory_limit, 1610612736ull);
    CHECK_EQ(o.cache_limit, 64ull << 20);
    CHECK_STATUS(um__options_apply(&o, "memory_limit=12Q", "UNIMEM_CONF"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'memory_limit'", "'12Q'", "UNIMEM_CONF");
    CHECK_ERROR_MENTIONS("size", NULL, NULL);
    CHECK_STATUS(um__options_apply(&o, "host_capacity=99999999T", "test"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'host_capacity'", "overflows", NULL);
    CHECK_STATUS(um__options_apply(&o, "sim_granularity=", "test"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'sim_granularity'", "empty", NULL);
    CHECK_EQ(o.memory_limit, 1610612736ull);

    /* STRING: at most 255 characters fit. */
    char conf[400];
    memcpy(conf, "devices=", 8);
    memset(conf + 8, 'a', 255);
    conf[8 + 255] = '\0';
    CHECK_OK(um__options_apply(&o, conf, "test"));
    CHECK_EQ(strlen(o.devices), 255);
    conf[8 + 255] = 'a';
    conf[8 + 256] = '\0';
    CHECK_STATUS(um__options_apply(&o, conf, "test"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'devices'", "256 characters", "at most 255");
    CHECK_EQ(strlen(o.devices), 255);
}

static void test_syntax(void)
{
    um__options o, before;
    um__options_defaults(&o);

    /* Unknown keys name the key, the source and the valid keys. */
    before = o;
    CHECK_STATUS(um__options_apply(&o, "va_factor=8,foo=1", "um_init"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("unknown option 'foo'", "in um_init", "valid options: log_level devices ");
    CHECK_ERROR_MENTIONS("va_factor", "devices", "thread_cache");
    CHECK(memcmp(&o, &before, sizeof o) == 0); /* va_factor=8 was not applied */
    CHECK_STATUS(um__options_apply(&o, "Log_Level=info", "UNIMEM_CONF"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'Log_Level'", "UNIMEM_CONF", NULL);
    CHECK_STATUS(um__options_apply(&o, "log level=info", "test"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'log level'", NULL, NULL);

    /* A token without '=' and an empty key. */
    CHECK_STATUS(um__options_apply(&o, "va_factor=2,thread_cache", "test"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'thread_cache'", "key=value", NULL);
    CHECK_STATUS(um__options_apply(&o, "=5", "test"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("empty key", NULL, NULL);
    CHECK(memcmp(&o, &before, sizeof o) == 0);

    /* NULL, "" and separators only apply nothing. */
    CHECK_OK(um__options_apply(&o, NULL, "test"));
    CHECK_OK(um__options_apply(&o, "", "test"));
    CHECK_OK(um__options_apply(&o, " , ,, ", "test"));
    CHECK(memcmp(&o, &before, sizeof o) == 0);
    CHECK_STATUS(um__options_apply(NULL, "va_factor=2", "test"), UM_ERR_INVALID);

    /* Whitespace around keys and values; the last of repeated keys wins. */
    CHECK_OK(um__options_apply(&o, "  va_factor = 3 , thread_cache= off ,", "test"));
    CHECK_EQ(o.va_factor, 3);
    CHECK_EQ(o.thread_cache, 0);
    CHECK_OK(um__options_apply(&o, "va_factor=2,va_factor=9,,va_factor=5", "test"));
    CHECK_EQ(o.va_factor, 5);

    /* The devices value runs up to the next known key. */
    CHECK_OK(um__options_apply(&o, "devices=sim:1G,sim:2x4G,allocator=direct", "test"));
    CHECK(strcmp(o.devices, "sim:1G,sim:2x4G") == 0);
    CHECK_EQ(o.allocator, UM_ALLOCATOR_DIRECT);
    CHECK_OK(um__options_apply(&o, "allocator=bufcache,devices=sim:1G+sim:2G", "test"));
    CHECK(strcmp(o.devices, "sim:1G+sim:2G") == 0);
    CHECK_EQ(o.allocator, UM_ALLOCATOR_BUFCACHE);
    CHECK_OK(um__options_apply(&o, "devices= sim:1G , sim:2G , va_factor =2", "test"));
    CHECK(strcmp(o.devices, "sim:1G , sim:2G") == 0);
    CHECK_EQ(o.va_factor, 2);
    CHECK_OK(um__options_apply(&o, "devices=cuda,sim:4G,devices=sim:8G,cuda", "test"));
    CHECK(strcmp(o.devices, "sim:8G,cuda") == 0);
    CHECK_OK(um__options_apply(&o, "devices=", "test"));
    CHECK(strcmp(o.devices, "") == 0);
    /* An unknown key after a comma ends the device list and is reported
     * as an unknown option. */
    CHECK_STATUS(um__options_apply(&o, "devices=sim:1G,bogus=2", "test"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("unknown option 'bogus'", NULL, NULL);
    CHECK(strcmp(o.devices, "") == 0);
}

/* A string value ends at a ',' followed by a key-like word and '=', known
 * option or not, so a misspelled key after it is reported, not swallowed. */
static void test_string_value_ends(void)
{
    static const char *const strings[] = {"devices", "spill_dir", "trace_file",
                                          "task_trace", "link_cache", "fault"};
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++) {
        um__options o, before;
        um__options_defaults(&o);
        before = o;
        char conf[128];
        snprintf(conf, sizeof conf, "%s=/tmp/t.json,memroy_limit=1G", strings[i]);
        um__clear_error();
        CHECK_STATUS(um__options_apply(&o, conf, "um_init"), UM_ERR_BAD_OPTION);
        CHECK_ERROR_MENTIONS("unknown option 'memroy_limit' in um_init", "valid options", NULL);
        CHECK(strstr(um_last_error(), "/tmp/t.json") == NULL);
        CHECK(memcmp(&o, &before, sizeof o) == 0);
    }
    um__options o;
    um__options_defaults(&o);
    /* Keys with '-', '.' or spaces are key-like too (typos of a key). */
    CHECK_STATUS(um__options_apply(&o, "trace_file=/tmp/t.json, memory-limit = 1G", "test"),
                 UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("unknown option 'memory-limit'", NULL, NULL);
    CHECK_STATUS(um__options_apply(&o, "spill_dir=/tmp,memory limit=1G", "test"),
                 UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("unknown option 'memory limit'", NULL, NULL);
    CHECK_STATUS(um__options_apply(&o, "fault=map@3+copy~0.5,fault.seed=2", "test"),
                 UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("unknown option 'fault.seed'", NULL, NULL);
    CHECK_EQ(o.trace_file[0], '\0');
    CHECK_EQ(o.spill_dir[0], '\0');
    CHECK_EQ(o.fault[0], '\0');

    /* Commas that do not start "key=" stay in the value: device lists, and
     * paths whose text after the comma has no '=' or a '/' before it. */
    CHECK_OK(um__options_apply(&o, "devices=sim:1G,sim:2x64M+cuda:0, cuda,va_factor=3", "test"));
    CHECK(strcmp(o.devices, "sim:1G,sim:2x64M+cuda:0, cuda") == 0);
    CHECK_EQ(o.va_factor, 3);
    CHECK_OK(um__options_apply(&o, "trace_file=/tmp/a,b.json,task_trace=/x/r,1/t=2.txt", "test"));
    CHECK(strcmp(o.trace_file, "/tmp/a,b.json") == 0);
    CHECK(strcmp(o.task_trace, "/x/r,1/t=2.txt") == 0);
    CHECK_OK(um__options_apply(&o, "fault=0:map@3+copy~0.5,fault_seed=7", "test"));
    CHECK(strcmp(o.fault, "0:map@3+copy~0.5") == 0);
    CHECK_EQ(o.fault_seed, 7);
    CHECK_OK(um__options_apply(&o, "link_cache=/c/l,x,=y", "test"));
    CHECK(strcmp(o.link_cache, "/c/l,x,=y") == 0);
    /* The rule's one cost: a path with ",word=" in it cannot be written. */
    CHECK_STATUS(um__options_apply(&o, "spill_dir=/tmp/a,b=c", "test"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("unknown option 'b'", NULL, NULL);
    CHECK_EQ(o.spill_dir[0], '\0');

    /* Through um_init, as the review's reproducer did. */
    um_context *ctx = NULL;
    CHECK_STATUS(um_init("devices=sim:64M,trace_file=/tmp/t.json,memroy_limit=1G", &ctx),
                 UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("unknown option 'memroy_limit'", "in um_init", NULL);
    CHECK(ctx == NULL);
    if (ctx)
        um_shutdown(ctx);
}

/* The unknown-option message lists every option, exactly and in order. */
static void test_unknown_lists_all(void)
{
    um__options o;
    um__options_defaults(&o);
    CHECK_STATUS(um__options_apply(&o, "bogus=1", "um_init"), UM_ERR_BAD_OPTION);
    const char *list = strstr(um_last_error(), "valid options: ");
    CHECK(list != NULL);
    if (!list)
        return;
    list += strlen("valid options: ");
    int n = 0;
    while (*list) {
        size_t len = strcspn(list, " ");
        um_option_info info;
        harness_checks++;
        if (n >= um_option_count() || um_option_get(n, &info) != UM_OK ||
            strlen(info.name) != len || memcmp(info.name, list, len) != 0)
            harness_report(__FILE__, __LINE__, "name %d of the list is '%.*s'", n, (int)len,
                           list);
        n++;
        list += len;
        if (*list == ' ')
            list++;
    }
    CHECK_EQ(n, um_option_count());
}

/* A size must be a whole number of bytes, and not round a non-zero value
 * down to 0 (which means "no limit" for memory_limit). */
static void test_size_fractions(void)
{
    size_t out = 777;
    CHECK_STATUS(um_parse_size("1.5", &out), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("'1.5'", "fraction of a byte", NULL);
    CHECK_STATUS(um_parse_size("0.7B", &out), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("'0.7B'", "fraction of a byte", NULL);
    CHECK_STATUS(um_parse_size("0.0000001K", &out), UM_ERR_INVALID);
    CHECK_ERROR_MENTIONS("'0.0000001K'", "less than one byte", NULL);
    CHECK_EQ(out, 777);
    CHECK_OK(um_parse_size("1.5K", &out));
    CHECK_EQ(out, 1536);
    CHECK_OK(um_parse_size("7.00", &out));
    CHECK_EQ(out, 7);

    um__options o;
    um__options_defaults(&o);
    CHECK_OK(um__options_apply(&o, "memory_limit=2G", "test"));
    CHECK_STATUS(um__options_apply(&o, "memory_limit=0.5", "um_init"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'memory_limit'", "'0.5'", "fraction of a byte");
    CHECK_STATUS(um__options_apply(&o, "memory_limit=0.0000001K", "um_init"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'memory_limit'", "'0.0000001K'", "less than one byte");
    CHECK_EQ(o.memory_limit, 2ull << 30);
    CHECK_OK(um__options_apply(&o, "memory_limit=0.5G", "test"));
    CHECK_EQ(o.memory_limit, 512ull << 20);
    CHECK_OK(um__options_apply(&o, "memory_limit=0.0", "test"));
    CHECK_EQ(o.memory_limit, 0);
}

/* cache_limit is a size or the word none: none, the default, is no cap
 * (SIZE_MAX, formatted back as none) and 0 keeps no cache, as
 * mx.set_cache_limit(0) does in MLX. The other size options do not take
 * none. The default was 0, meaning no cap, and none was refused. */
static void test_cache_limit_none(void)
{
    int index = -1;
    for (int i = 0; i < um_option_count(); i++) {
        um_option_info info;
        CHECK_OK(um_option_get(i, &info));
        if (!strcmp(info.name, "cache_limit"))
            index = i;
    }
    CHECK(index >= 0);
    um__options o;
    um__options_defaults(&o);
    CHECK_EQ(o.cache_limit, SIZE_MAX);
    char value[64] = "";
    CHECK_OK(um__options_format(&o, index, value, sizeof value));
    CHECK(strcmp(value, "none") == 0);

    CHECK_OK(um__options_apply(&o, "cache_limit=0", "test"));
    CHECK_EQ(o.cache_limit, 0);
    CHECK_OK(um__options_format(&o, index, value, sizeof value));
    CHECK(strcmp(value, "0") == 0);
    CHECK_OK(um__options_apply(&o, "cache_limit=none", "test"));
    CHECK_EQ(o.cache_limit, SIZE_MAX);
    CHECK_OK(um__options_apply(&o, "cache_limit=64M", "test"));
    CHECK_EQ(o.cache_limit, 64ull << 20);
    CHECK_OK(um__options_format(&o, index, value, sizeof value));
    CHECK(strcmp(value, "67108864") == 0);
    CHECK_OK(um__options_apply(&o, "cache_limit = None ", "test"));
    CHECK_EQ(o.cache_limit, SIZE_MAX);

    /* A bad value's message names both forms. */
    static const char *const bad[] = {"nothing", "", "-1", "non", "none1", "0.5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char conf[64];
        snprintf(conf, sizeof conf, "cache_limit=%s", bad[i]);
        CHECK_STATUS(um__options_apply(&o, conf, "test"), UM_ERR_BAD_OPTION);
        CHECK_ERROR_MENTIONS("'cache_limit'", "64M", "or none");
        CHECK_EQ(o.cache_limit, SIZE_MAX);
    }

    /* Other sizes: none is refused, and the message does not offer it. */
    CHECK_STATUS(um__options_apply(&o, "memory_limit=none", "test"), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'memory_limit'", "'none'", "64M");
    CHECK(strstr(um_last_error(), "or none") == NULL);
    CHECK_STATUS(um__options_apply(&o, "host_capacity=none", "test"), UM_ERR_BAD_OPTION);
    CHECK_EQ(o.memory_limit, 0);
    CHECK_EQ(o.host_capacity, 0);
}

/* A size option takes the word none exactly where its doc says so. */
static void test_size_none_documented(void)
{
    for (int i = 0; i < um_option_count(); i++) {
        um_option_info info;
        CHECK_OK(um_option_get(i, &info));
        if (info.type != UM_OPT_SIZE)
            continue;
        um__options o;
        um__options_defaults(&o);
        char conf[128];
        snprintf(conf, sizeof conf, "%s=none", info.name);
        bool takes_none = um__options_apply(&o, conf, "test") == UM_OK;
        harness_checks++;
        if (takes_none != (strstr(info.doc, "none") != NULL))
            harness_report(__FILE__, __LINE__, "option %s %s none, its doc: %s", info.name,
                           takes_none ? "takes" : "refuses", info.doc);
    }
}

/* UNIMEM_CONF is applied first, then the conf string of um_init. */
static void test_env(void)
{
    um_context *ctx = NULL;
    CHECK_EQ(setenv("UNIMEM_CONF",
                    "va_factor=2,allocator=direct,log_level=error,"
                    "devices=sim:64M",
                    1),
             0);
    CHECK_OK(um_init("allocator=bufcache,cache_limit=8M", &ctx));
    if (ctx) {
        CHECK_EQ(ctx->opts.va_factor, 2);
        CHECK_EQ(ctx->opts.allocator, UM_ALLOCATOR_BUFCACHE);
        CHECK_EQ(ctx->opts.cache_limit, 8u << 20);
        CHECK_EQ(ctx->opts.log_level, UM_LOG_ERROR);
        CHECK_EQ(atomic_load(&um__log_level_current), UM_LOG_ERROR);
        CHECK_EQ(um_device_count(ctx), 2);
        um_device_info info;
        CHECK_OK(um_device_info_get(ctx, 1, &info));
        CHECK(strcmp(info.allocator, "bufcache") == 0);
        CHECK_EQ(info.capacity, 64u << 20);
        um_shutdown(ctx);
    }
    /* conf overrides the devices of UNIMEM_CONF. */
    ctx = NULL;
    CHECK_OK(um_init("devices=sim:32M+sim:16M", &ctx));
    if (ctx) {
        CHECK_EQ(um_device_count(ctx), 3);
        CHECK_EQ(ctx->opts.allocator, UM_ALLOCATOR_DIRECT);
        um_device_info info;
        CHECK_OK(um_device_info_get(ctx, 2, &info));
        CHECK_EQ(info.capacity, 16u << 20);
        um_shutdown(ctx);
    }

    /* A bad UNIMEM_CONF fails um_init and says so. */
    ctx = (um_context *)&ctx;
    CHECK_EQ(setenv("UNIMEM_CONF", "allocator=direct,foo=1", 1), 0);
    CHECK_STATUS(um_init("allocator=direct", &ctx), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'foo'", "UNIMEM_CONF", NULL);
    CHECK(ctx == NULL);
    CHECK_EQ(setenv("UNIMEM_CONF", "memory_limit=lots", 1), 0);
    CHECK_STATUS(um_init(NULL, &ctx), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'memory_limit'", "'lots'", "UNIMEM_CONF");
    CHECK(ctx == NULL);
    /* ... even when conf would set the same key. */
    CHECK_STATUS(um_init("memory_limit=1G", &ctx), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("UNIMEM_CONF", NULL, NULL);

    /* A bad conf names um_init. */
    CHECK_EQ(setenv("UNIMEM_CONF", "allocator=direct", 1), 0);
    CHECK_STATUS(um_init("va_factor=0", &ctx), UM_ERR_BAD_OPTION);
    CHECK_ERROR_MENTIONS("'va_factor'", "in um_init", NULL);
    CHECK(ctx == NULL);
    CHECK_EQ(unsetenv("UNIMEM_CONF"), 0);
    um__log_set_level(UM_LOG_WARN);
}

/* um__options_value_splits says what um__options_apply does with the value
 * put into a string option: a file name holding ",KEY=" would set KEY. */
static void test_value_splits(void)
{
    static const struct {
        const char *value;
        bool splits;
    } cases[] = {{"t.json", false},
                 {"t,1.json", false},
                 {"/tmp/a,b/c=d.json", false},
                 {"t.json,sched=eager", true},
                 {"t.json, memory-limit =1G", true},
                 {"t.json,=x", false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_EQ(um__options_value_splits(cases[i].value), cases[i].splits);
        /* The parser agrees: the value kept whole, or cut at the comma. */
        um__options o;
        um__options_defaults(&o);
        char conf[128];
        snprintf(conf, sizeof conf, "trace_file=%s", cases[i].value);
        if (um__options_apply(&o, conf, "test") == UM_OK)
            CHECK_EQ(strcmp(o.trace_file, cases[i].value) != 0, cases[i].splits);
        else
            CHECK(cases[i].splits);
    }
}

int main(void)
{
    unsetenv("UNIMEM_CONF");
    test_table();
    test_defaults();
    test_parse_size();
    test_parse_size_random();
    test_types();
    test_syntax();
    test_string_value_ends();
    test_value_splits();
    test_unknown_lists_all();
    test_size_fractions();
    test_cache_limit_none();
    test_size_none_documented();
    test_env();
    return harness_finish("test_options");
}
