/*
 * options: owns the option table and its parser. The table, the field each
 * option is stored in and the static checks that the field has the right C
 * type are all generated from UM_OPTION_LIST in options.h, so an option is
 * declared in exactly one place. Values are parsed from "key=value,..."
 * strings (UNIMEM_CONF and the conf argument of um_init).
 */
#include "options.h"

#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* One row of the table: the public description plus where the value lives
 * in um__options. */
typedef struct opt_entry {
    um_option_info info;
    size_t offset;
    size_t size;
} opt_entry;

#define OPT_FIELD_(field) (((um__options *)0)->field)

#define OPT_ENTRY_(field, type, def, doc)                                                          \
    {{#field, type, def, doc}, offsetof(um__options, field), sizeof(OPT_FIELD_(field))},

static const opt_entry table[] = {UM_OPTION_LIST(OPT_ENTRY_)};

#define NOPTIONS ((int)(sizeof table / sizeof table[0]))

/* The parser writes INT, BOOL and ENUM values as int, SIZE values as size_t
 * and STRING values into a char array; these checks make a mismatch between
 * an option's type and its field a compile error instead of memory
 * corruption. The array decays to char * inside _Generic. */
#define OPT_CKIND_(field)                                                                          \
    _Generic((OPT_FIELD_(field)), int : 0, size_t : 1, char * : 2, default : 3)
#define OPT_WANT_(type) ((type) == UM_OPT_SIZE ? 1 : (type) == UM_OPT_STRING ? 2 : 0)
#define OPT_CHECK_(field, type, def, doc)                                                          \
    _Static_assert(OPT_CKIND_(field) == OPT_WANT_(type),                                           \
                   "option " #field ": the um__options field does not match its type");
UM_OPTION_LIST(OPT_CHECK_)

/* Ranges of the INT options, keyed by field so a renamed field is a compile
 * error. An INT option not listed here accepts 0..INT_MAX. */
typedef struct int_range {
    size_t offset;
    long min, max;
} int_range;

static const int_range int_ranges[] = {
    {offsetof(um__options, va_factor), 1, 64},
    {offsetof(um__options, copy_threads), 0, 64},
    {offsetof(um__options, watermark_high), 1, 100},
    {offsetof(um__options, watermark_low), 0, 100},
};

static void range_of(const opt_entry *e, long *min, long *max)
{
    *min = 0;
    *max = INT_MAX;
    for (size_t i = 0; i < sizeof int_ranges / sizeof int_ranges[0]; i++) {
        if (int_ranges[i].offset == e->offset) {
            *min = int_ranges[i].min;
            *max = int_ranges[i].max;
        }
    }
}

/* SIZE options that also take the word none, stored as SIZE_MAX: no cap
 * where 0 means something else (a cache limit of 0 keeps no cache). Their
 * docs say so; keyed by field, as int_ranges is. */
static const size_t sizes_with_none[] = {offsetof(um__options, cache_limit)};

static bool takes_none(const opt_entry *e)
{
    for (size_t i = 0; i < sizeof sizes_with_none / sizeof sizes_with_none[0]; i++)
        if (sizes_with_none[i] == e->offset)
            return true;
    return false;
}

/* ------------------------------------------------------------- sizes */

/* Largest number of decimal places um_parse_size accepts; far more than a
 * byte count can use, and it bounds the exact fraction arithmetic below. */
#define SIZE_MAX_DECIMALS 32

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Parses text[0..len) as a size. On failure returns false with *why set to a
 * phrase saying what is wrong. The fraction is multiplied by the unit
 * exactly (a decimal fraction doubled stays a decimal fraction of the same
 * length), so "1.1K" is exactly floor(1.1 * 1024) = 1126 bytes. A fraction
 * needs a unit, and a value that is not 0 must come to at least one byte. */
bool um__parse_size(const char *text, size_t len, size_t *out, const char **why)
{
    const char *p = text, *end = text + len;
    while (p < end && is_space(*p))
        p++;
    while (end > p && is_space(end[-1]))
        end--;
    if (p == end) {
        *why = "it is empty";
        return false;
    }
    if (*p == '-') {
        *why = "sizes cannot be negative";
        return false;
    }
    if (!is_digit(*p)) {
        *why = "it does not start with a digit";
        return false;
    }
    uint64_t whole = 0;
    for (; p < end && is_digit(*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (whole > (UINT64_MAX - d) / 10) {
            *why = "it overflows 64 bits";
            return false;
        }
        whole = whole * 10 + d;
    }
    unsigned char frac[SIZE_MAX_DECIMALS];
    size_t nfrac = 0;
    bool frac_nonzero = false;
    if (p < end && *p == '.') {
        p++;
        if (p == end || !is_digit(*p)) {
            *why = "a digit must follow the decimal point";
            return false;
        }
        for (; p < end && is_digit(*p); p++) {
            if (nfrac == SIZE_MAX_DECIMALS) {
                *why = "it has more than 32 decimal places";
                return false;
            }
            frac[nfrac++] = (unsigned char)(*p - '0');
            frac_nonzero |= *p != '0';
        }
    }
    while (p < end && is_space(*p))
        p++;
    unsigned shift = 0;
    if (p < end) {
        switch (*p) {
        case 'k':
        case 'K':
            shift = 10;
            p++;
            break;
        case 'm':
        case 'M':
            shift = 20;
            p++;
            break;
        case 'g':
        case 'G':
            shift = 30;
            p++;
            break;
        case 't':
        case 'T':
            shift = 40;
            p++;
            break;
        default:
            break;
        }
        /* After a unit letter "iB" or "B" may follow; a bare "B" means bytes. */
        if (shift && p < end && (*p == 'i' || *p == 'I') && p + 1 < end &&
            (p[1] == 'b' || p[1] == 'B'))
            p += 2;
        else if (p < end && (*p == 'b' || *p == 'B'))
            p++;
        if (p != end) {
            *why = "the unit is not one of B, K, M, G, T (optionally followed by B or iB)";
            return false;
        }
    }
    /* Truncating a fraction of a byte would change the value silently
     * ("0.5" would become 0, which means "no limit" or "no cache" for
     * several options). */
    if (!shift && frac_nonzero) {
        *why = "without a unit it is a number of bytes, which cannot have a fraction of a byte";
        return false;
    }
    if (shift && whole > (UINT64_MAX >> shift)) {
        *why = "it overflows 64 bits";
        return false;
    }
    uint64_t bytes = whole << shift;
    /* Doubling the fraction `shift` times; each carry out of the first
     * decimal place is one more byte. */
    uint64_t carry_bytes = 0;
    for (unsigned s = 0; s < shift; s++) {
        unsigned carry = 0;
        for (size_t i = nfrac; i-- > 0;) {
            unsigned d = frac[i] * 2u + carry;
            frac[i] = (unsigned char)(d % 10);
            carry = d / 10;
        }
        carry_bytes = carry_bytes * 2 + carry;
    }
    if (bytes > UINT64_MAX - carry_bytes || bytes + carry_bytes > SIZE_MAX) {
        *why = "it does not fit in size_t";
        return false;
    }
    /* A value that is not 0 must not round down to 0, which options read
     * as "no limit", "no cache" or "the default". */
    if (bytes + carry_bytes == 0 && (whole || frac_nonzero)) {
        *why = "it is more than 0 but less than one byte";
        return false;
    }
    *out = (size_t)(bytes + carry_bytes);
    return true;
}

um_status um_parse_size(const char *text, size_t *out)
{
    const char *why = NULL;
    if (!text || !out)
        return um__fail(UM_ERR_INVALID, "um_parse_size: %s is NULL", text ? "out" : "text");
    if (!um__parse_size(text, strlen(text), out, &why))
        return um__fail(UM_ERR_INVALID, "size '%.80s' is not valid: %s", text, why);
    return UM_OK;
}

/* ------------------------------------------------------------- values */

/* Finds the enum word value[0..len) in the '|' list that starts doc (up to
 * the ':'); returns its index or -1. */
static int enum_index(const char *doc, const char *value, size_t len)
{
    const char *colon = strchr(doc, ':');
    const char *end = colon ? colon : doc + strlen(doc);
    int index = 0;
    for (const char *w = doc; w < end; index++) {
        const char *bar = memchr(w, '|', (size_t)(end - w));
        const char *wend = bar ? bar : end;
        if ((size_t)(wend - w) == len && !memcmp(w, value, len))
            return index;
        w = wend + 1;
    }
    return -1;
}

static bool parse_bool(const char *v, size_t len, int *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strlen(yes[i]) == len && !strncasecmp(v, yes[i], len)) {
            *out = 1;
            return true;
        }
        if (strlen(no[i]) == len && !strncasecmp(v, no[i], len)) {
            *out = 0;
            return true;
        }
    }
    return false;
}

static bool parse_int(const char *v, size_t len, long min, long max, int *out)
{
    size_t i = 0;
    bool neg = false;
    if (len > 0 && v[0] == '-') {
        neg = true;
        i = 1;
    }
    if (i == len)
        return false;
    long long n = 0;
    for (; i < len; i++) {
        if (!is_digit(v[i]))
            return false;
        n = n * 10 + (v[i] - '0');
        if (n > (long long)INT_MAX + 1)
            return false;
    }
    if (neg)
        n = -n;
    if (n < min || n > max)
        return false;
    *out = (int)n;
    return true;
}

/* Sets e's field in o from v[0..len) (already trimmed). On failure o is
 * untouched and the status names the key, the value, what was expected and
 * where the value came from. */
static um_status set_value(um__options *o, const opt_entry *e, const char *v, size_t len,
                           const char *source)
{
    void *field = (char *)o + e->offset;
    const char *name = e->info.name;
    int shown = len > 80 ? 80 : (int)len;
    const char *more = len > 80 ? "..." : "";
    switch (e->info.type) {
    case UM_OPT_INT: {
        long min, max;
        int n;
        range_of(e, &min, &max);
        if (!parse_int(v, len, min, max, &n))
            return um__fail(UM_ERR_BAD_OPTION,
                            "option '%s' in %s: bad value '%.*s%s': expected a decimal integer "
                            "from %ld to %ld",
                            name, source, shown, v, more, min, max);
        *(int *)field = n;
        return UM_OK;
    }
    case UM_OPT_BOOL: {
        int b;
        if (!parse_bool(v, len, &b))
            return um__fail(UM_ERR_BAD_OPTION,
                            "option '%s' in %s: bad value '%.*s%s': expected a boolean "
                            "(1/0, true/false, yes/no, on/off)",
                            name, source, shown, v, more);
        *(int *)field = b;
        return UM_OK;
    }
    case UM_OPT_SIZE: {
        size_t bytes;
        const char *why = NULL;
        bool none = takes_none(e);
        if (none && len == 4 && !strncasecmp(v, "none", 4))
            bytes = SIZE_MAX;
        else if (!um__parse_size(v, len, &bytes, &why))
            return um__fail(UM_ERR_BAD_OPTION,
                            "option '%s' in %s: bad value '%.*s%s': expected a size in bytes, "
                            "optionally with a K/M/G/T suffix such as 64M or 1.5GiB%s (%s)",
                            name, source, shown, v, more, none ? ", or none" : "", why);
        *(size_t *)field = bytes;
        return UM_OK;
    }
    case UM_OPT_STRING:
        if (len >= e->size)
            return um__fail(UM_ERR_BAD_OPTION,
                            "option '%s' in %s: bad value '%.*s%s': the string is %zu characters "
                            "long, at most %zu fit",
                            name, source, shown, v, more, len, e->size - 1);
        memcpy(field, v, len);
        ((char *)field)[len] = '\0';
        return UM_OK;
    case UM_OPT_ENUM: {
        int index = enum_index(e->info.doc, v, len);
        if (index < 0) {
            const char *colon = strchr(e->info.doc, ':');
            int words = colon ? (int)(colon - e->info.doc) : (int)strlen(e->info.doc);
            return um__fail(UM_ERR_BAD_OPTION,
                            "option '%s' in %s: bad value '%.*s%s': expected one of %.*s", name,
                            source, shown, v, more, words, e->info.doc);
        }
        *(int *)field = index;
        return UM_OK;
    }
    }
    return um__fail(UM_ERR_INTERNAL, "option '%s' has unknown type %d", name, (int)e->info.type);
}

/* ------------------------------------------------------------- table */

static const opt_entry *find_option(const char *key, size_t len)
{
    for (int i = 0; i < NOPTIONS; i++) {
        if (strlen(table[i].info.name) == len && !memcmp(table[i].info.name, key, len))
            return &table[i];
    }
    return NULL;
}

void um__options_defaults(um__options *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 0; i < NOPTIONS; i++) {
        const char *def = table[i].info.default_value;
        /* A default that does not parse is a bug in options.h; test_options
         * checks every one, so this only logs instead of aborting a program. */
        if (set_value(o, &table[i], def, strlen(def), "the option table") != UM_OK)
            um__log(UM_LOG_ERROR, "%s", um_last_error());
    }
}

static bool is_key_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_';
}

/* True when the text at p (just after a ',') is "<word>=": a word of key
 * characters, '-', '.' and spaces, with at least one key character, known
 * option or not. A misspelled key (memroy_limit, memory-limit) then ends a
 * string value and is reported as unknown instead of being swallowed; '/'
 * and ':' are left out so paths and device specs keep their commas. */
static bool starts_key(const char *p)
{
    bool key_char = false;
    for (; *p && *p != '='; p++) {
        if (is_key_char(*p))
            key_char = true;
        else if (*p != '-' && *p != '.' && !is_space(*p))
            return false;
    }
    return *p == '=' && key_char;
}

bool um__options_value_splits(const char *value)
{
    for (const char *p = strchr(value, ','); p; p = strchr(p + 1, ','))
        if (starts_key(p + 1))
            return true;
    return false;
}

static void trim(const char **s, const char **e)
{
    while (*s < *e && is_space(**s))
        (*s)++;
    while (*e > *s && is_space((*e)[-1]))
        (*e)--;
}

/* sizeof each name counts its NUL, so the sum holds every name, one
 * separator after each but the last, and the final NUL: this buffer never
 * cuts the list of valid options, however many options there are. */
#define OPT_NAME_BYTES_(field, type, def, doc) +sizeof(#field)
enum { OPT_NAMES_BYTES = 0 UM_OPTION_LIST(OPT_NAME_BYTES_) };

static um_status unknown_key(const char *key, size_t len, const char *source)
{
    /* One space between names: the whole message, with a long misspelled
     * key, must fit in the last-error buffer (status.c). */
    char valid[OPT_NAMES_BYTES];
    size_t n = 0;
    valid[0] = '\0';
    for (int i = 0; i < NOPTIONS && n < sizeof valid; i++) {
        int w = snprintf(valid + n, sizeof valid - n, "%s%s", i ? " " : "", table[i].info.name);
        if (w < 0)
            break;
        n += (size_t)w;
    }
    int shown = len > 64 ? 64 : (int)len;
    return um__fail(UM_ERR_BAD_OPTION, "unknown option '%.*s%s' in %s; valid options: %s", shown,
                    key, len > 64 ? "..." : "", source, valid);
}

um_status um__options_apply(um__options *o, const char *conf, const char *source)
{
    if (!o)
        return um__fail(UM_ERR_INVALID, "um__options_apply: options are NULL");
    if (!source)
        source = "options";
    if (!conf)
        return UM_OK;
    /* Parsed into a copy so a failure part way leaves *o unchanged. */
    um__options tmp = *o;
    const char *p = conf;
    while (*p) {
        if (*p == ',' || is_space(*p)) {
            p++; /* empty entries and separators */
            continue;
        }
        const char *key = p;
        while (*p && *p != '=' && *p != ',')
            p++;
        const char *kend = p;
        trim(&key, &kend);
        if (*p != '=') {
            int shown = kend - key > 64 ? 64 : (int)(kend - key);
            return um__fail(UM_ERR_BAD_OPTION,
                            "'%.*s' in %s is not key=value (options are \"key=value,key=value\")",
                            shown, key, source);
        }
        if (kend == key)
            return um__fail(UM_ERR_BAD_OPTION, "an option in %s has an empty key before '='",
                            source);
        const opt_entry *e = find_option(key, (size_t)(kend - key));
        if (!e)
            return unknown_key(key, (size_t)(kend - key), source);
        const char *v = ++p;
        if (e->info.type == UM_OPT_STRING) {
            /* String values (device lists, paths) may contain commas; the
             * value ends where the next "key=" starts (see options.h). */
            while (*p && !(*p == ',' && starts_key(p + 1)))
                p++;
        } else {
            while (*p && *p != ',')
                p++;
        }
        const char *vend = p;
        trim(&v, &vend);
        um_status s = set_value(&tmp, e, v, (size_t)(vend - v), source);
        if (s != UM_OK)
            return s;
    }
    *o = tmp;
    return UM_OK;
}

const char *um__allocator_name(int kind)
{
    switch (kind) {
    case UM_ALLOCATOR_POOL:
        return "pool";
    case UM_ALLOCATOR_DIRECT:
        return "direct";
    case UM_ALLOCATOR_BUFCACHE:
        return "bufcache";
    default:
        return "unknown";
    }
}

/* ------------------------------------------------------------- public */

int um_option_count(void)
{
    return NOPTIONS;
}

um_status um_option_get(int index, um_option_info *out)
{
    if (!out)
        return um__fail(UM_ERR_INVALID, "um_option_get: out is NULL");
    if (index < 0 || index >= NOPTIONS)
        return um__fail(UM_ERR_INVALID, "um_option_get: index %d is outside 0..%d", index,
                        NOPTIONS - 1);
    *out = table[index].info;
    return UM_OK;
}

um_status um__options_format(const um__options *o, int index, char *buf, size_t len)
{
    if (index < 0 || index >= NOPTIONS)
        return um__fail(UM_ERR_INVALID, "option index %d is outside 0..%d", index, NOPTIONS - 1);
    if (!buf || !len)
        return um__fail(UM_ERR_INVALID, "option %s: no buffer for its value",
                        table[index].info.name);
    const opt_entry *e = &table[index];
    const char *field = (const char *)o + e->offset;
    int n = 0;
    switch (e->info.type) {
    case UM_OPT_SIZE: {
        size_t bytes = *(const size_t *)(const void *)field;
        n = bytes == SIZE_MAX && takes_none(e) ? snprintf(buf, len, "none")
                                               : snprintf(buf, len, "%zu", bytes);
        break;
    }
    case UM_OPT_STRING:
        n = snprintf(buf, len, "%s", field);
        break;
    case UM_OPT_ENUM: {
        /* The value'th word of the "a|b|c: ..." doc line. */
        int v = *(const int *)(const void *)field;
        const char *w = e->info.doc;
        for (int k = 0; k < v && w; k++) {
            w = strchr(w, '|');
            w = w ? w + 1 : NULL;
        }
        size_t wl = w ? strcspn(w, "|:") : 0;
        n = w ? snprintf(buf, len, "%.*s", (int)wl, w) : snprintf(buf, len, "%d", v);
        break;
    }
    default: /* INT and BOOL are ints */
        n = snprintf(buf, len, "%d", *(const int *)(const void *)field);
        break;
    }
    if (n < 0 || (size_t)n >= len)
        return um__fail(UM_ERR_INVALID, "option %s: its value needs %d bytes, the buffer has %zu",
                        e->info.name, n + 1, len);
    return UM_OK;
}

/* An ENUM value is the index of its word in the doc line, so the C enums
 * that options.h declares for them must list their values in the same
 * order (test_options checks the words themselves). */
_Static_assert(UM_ALLOCATOR_BUFCACHE == 2 && UM_LOG_DEBUG == 3,
               "enum option words and their C enums must stay in the same order");
