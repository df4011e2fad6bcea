/* A strict, streaming JSON reader for Chrome trace files (`unimem
 * timeline`). The document is read through zlib, so plain and gzip files
 * (one or more members, and nothing after them) both work; each element
 * of the trace's event array is parsed into a small tree handed to a
 * callback and dropped before the next, so a trace of any length needs
 * memory for one event only. The rest of the document is parsed, and so
 * validated, without being kept. */
#ifndef UM_JSON_READER_H
#define UM_JSON_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum json_type {
    JSON_NULL,
    JSON_FALSE,
    JSON_TRUE,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT
} json_type;

typedef struct json_value json_value;
struct json_value {
    json_type type;
    bool is_uint;    /* a number written as a non-negative integer that fits 64 bits */
    uint64_t u;      /* its value when is_uint */
    double num;      /* every number's value */
    const char *str; /* strings: NUL-terminated UTF-8, len bytes (may hold \u0000) */
    size_t len;
    const char *key; /* a member of an object: its name */
    size_t key_len;
    json_value *first; /* arrays and objects: the first element or member */
    json_value *next;  /* the next element or member of the parent */
    uint64_t line;     /* the line the value starts on (1-based) */
};

/* The last member of object obj named key (JSON allows repeats; the last
 * wins, as in JavaScript), or NULL when obj is no object or has none. */
const json_value *json_get(const json_value *obj, const char *key);
/* The string's text, or NULL when v is no string. */
const char *json_str(const json_value *v);
/* True, with *out set, when v is a non-negative integer that fits 64 bits. */
bool json_u64(const json_value *v, uint64_t *out);
/* True, with *out set, when v is an integer within +-2^53. */
bool json_i64(const json_value *v, int64_t *out);
/* True, with *out set, when v is a number. */
bool json_number(const json_value *v, double *out);

/* Called for each object in the event array. Returns 0 to go on; anything
 * else stops the read, with why (a message of at most why_len bytes) saying
 * what is wrong with the event. */
typedef int (*json_event_fn)(void *arg, const json_value *event, char *why, size_t why_len);

/* Reads a whole Chrome trace from fd, plain or gzip: either an object whose
 * "traceEvents" member is the event array, or the array alone, after a
 * UTF-8 byte-order mark if the input starts with one. Elements of the
 * array that are not objects are skipped. Returns 0 when the whole
 * document is valid and every callback returned 0; otherwise writes a
 * message naming the line, column and byte offset into err and returns -1.
 * Input beyond max_bytes (after decompression) is an error. */
int json_read_trace(int fd, uint64_t max_bytes, json_event_fn fn, void *arg, char *err,
                    size_t err_len);

#endif
