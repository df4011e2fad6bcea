/* `unimem info`: the devices of a context made from UNIMEM_CONF (and
 * --conf), and with --options the option table, as text or JSON. Uses the
 * public API only. */
#include "tool.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void info_usage(FILE *f)
{
    fprintf(f, "usage: unimem info [--options] [--json] [--conf \"key=value,...\"]\n"
               "  prints the devices of a context made from UNIMEM_CONF, then --conf;\n"
               "  --options adds the option table (name, type, default, current value, doc)\n");
}

static const char *type_name(um_option_type t)
{
    switch (t) {
    case UM_OPT_INT:
        return "int";
    case UM_OPT_BOOL:
        return "bool";
    case UM_OPT_SIZE:
        return "size";
    case UM_OPT_STRING:
        return "string";
    case UM_OPT_ENUM:
        return "enum";
    }
    return "unknown";
}

/* A limit of SIZE_MAX means "no cap". */
static const char *limit_text(char *buf, size_t bytes)
{
    if (bytes == SIZE_MAX)
        return "none";
    return tool_bytes(buf, bytes);
}

static int print_devices(um_context *ctx, bool json)
{
    int n = um_device_count(ctx);
    if (json) {
        printf("  \"devices\": [");
    } else {
        printf("%-4s %-6s %-10s %12s %12s %12s %12s  %s\n", "dev", "kind", "name", "capacity",
               "granularity", "mem limit", "cache limit", "allocator");
    }
    for (int i = 0; i < n; i++) {
        um_device_info d;
        um_status s = um_device_info_get(ctx, i, &d);
        if (s != UM_OK)
            return tool_fail("info", s);
        if (json) {
            printf("%s\n    {\"index\": %d, \"kind\": ", i ? "," : "", d.index);
            tool_json_string(stdout, um_device_kind_name(d.kind));
            printf(", \"name\": ");
            tool_json_string(stdout, d.name);
            printf(", \"capacity\": %zu, \"granularity\": %zu, \"memory_limit\": %zu, "
                   "\"cache_limit\": ",
                   d.capacity, d.granularity, d.memory_limit);
            if (d.cache_limit == SIZE_MAX)
                printf("null");
            else
                printf("%zu", d.cache_limit);
            printf(", \"allocator\": ");
            tool_json_string(stdout, d.allocator);
            printf(", \"ordinal\": %d, \"product\": ", d.ordinal);
            tool_json_string(stdout, d.product);
            printf(", \"compute_capability\": \"%d.%d\", \"pci_bus_id\": ", d.cc_major,
                   d.cc_minor);
            tool_json_string(stdout, d.pci_bus_id);
            printf(", \"vmm\": %s, \"pinned\": %s}", d.vmm ? "true" : "false",
                   d.pinned ? "true" : "false");
        } else {
            char cap[32], gran[32], mem[32], cache[32];
            printf("%-4d %-6s %-10s %12s %12s %12s %12s  %s\n", d.index, um_device_kind_name(d.kind), d.name,
                   tool_bytes(cap, d.capacity), tool_bytes(gran, d.granularity),
                   limit_text(mem, d.memory_limit), limit_text(cache, d.cache_limit), d.allocator);
            if (d.kind == UM_DEVICE_CUDA)
                printf("     GPU %d (%s), compute capability %d.%d, PCI %s, pages through %s\n",
                       d.ordinal, d.product, d.cc_major, d.cc_minor, d.pci_bus_id,
                       d.vmm ? "CUDA VMM" : "cuMemAlloc segments");
            else if (d.kind == UM_DEVICE_HOST)
                printf("     %s host memory\n",
                       d.pinned ? "page-locked (CUDA VMM pages on the host)" : "pageable");
        }
    }
    if (json)
        printf("\n  ]");
    return 0;
}

/* The CUDA driver, and the link between every pair of devices as it
 * reports them (peer access, its performance rank, native atomics). */
static int print_cuda(um_context *ctx, bool json)
{
    char why[256];
    int version = 0, gpus = 0;
    um_status s = um_cuda_driver_info(&version, &gpus, why, sizeof why);
    if (json) {
        printf(",\n  \"cuda\": {\"available\": %s, \"driver_version\": %d, \"gpus\": %d, "
               "\"why_absent\": ",
               s == UM_OK ? "true" : "false", version, gpus);
        tool_json_string(stdout, s == UM_OK ? "" : why);
        printf(", \"links\": [");
    } else if (s == UM_OK) {
        printf("\nCUDA driver %d.%d, %d GPU%s\n", version / 1000, version % 1000 / 10, gpus,
               gpus == 1 ? "" : "s");
    } else {
        printf("\nno CUDA devices: %s\n", why);
    }
    int n = um_device_count(ctx), shown = 0;
    for (int a = 1; a < n; a++) {
        for (int b = 1; b < n; b++) {
            um_device_info da, db;
            um_link_info l;
            if (a == b || um_device_info_get(ctx, a, &da) != UM_OK ||
                um_device_info_get(ctx, b, &db) != UM_OK || da.kind != UM_DEVICE_CUDA ||
                db.kind != UM_DEVICE_CUDA)
                continue;
            if ((s = um_device_link_get(ctx, a, b, &l)) != UM_OK)
                return tool_fail("info", s);
            if (json)
                printf("%s{\"from\": %d, \"to\": %d, \"peer_access\": %s, "
                       "\"performance_rank\": %d, \"native_atomics\": %s}",
                       shown ? ", " : "", a, b, l.peer_access ? "true" : "false",
                       l.performance_rank, l.native_atomics ? "true" : "false");
            else
                printf("  device %d -> %d: %s, rank %d%s\n", a, b,
                       l.peer_access ? "peer access" : "no peer access (copies go through the host)",
                       l.performance_rank, l.native_atomics ? ", native atomics" : "");
            shown++;
        }
    }
    if (json)
        printf("]}");
    return 0;
}

/* The link costs the transfer engine picks copy sources by: GB/s and
 * latency of a copy from each device (row) to each other (column). */
static int print_link_costs(um_context *ctx, bool json)
{
    int n = um_device_count(ctx);
    um_link_stats ls;
    um_status s = um_link_stats_get(ctx, 0, 0, &ls);
    if (s != UM_OK)
        return tool_fail("info", s);
    if (json)
        printf(",\n  \"link_costs\": {\"measured\": %s, \"links\": [",
               ls.measured ? "true" : "false");
    else
        printf("\nlink costs (%s): GB/s, latency us; row = from, column = to\n     ",
               ls.measured ? "measured once per machine, then read from link_cache" : "model");
    for (int b = 0; b < n && !json; b++)
        printf(" %16d", b);
    for (int a = 0, shown = 0; a < n; a++) {
        if (!json)
            printf("\n  %-3d", a);
        for (int b = 0; b < n; b++) {
            if ((s = um_link_stats_get(ctx, a, b, &ls)) != UM_OK)
                return tool_fail("info", s);
            if (json && a != b)
                printf("%s{\"from\": %d, \"to\": %d, \"gbps\": %.3f, \"latency_us\": %.3f}",
                       shown++ ? ", " : "", a, b, ls.bandwidth_gbps, ls.latency_us);
            else if (!json && a == b)
                printf(" %16s", "-");
            else if (!json)
                printf(" %8.2f %7.2f", ls.bandwidth_gbps, ls.latency_us);
        }
    }
    printf(json ? "]}" : "\n");
    return 0;
}

static int print_options(um_context *ctx, bool json)
{
    int n = um_option_count();
    if (json)
        printf(",\n  \"options\": [");
    else
        printf("\noptions (UNIMEM_CONF=\"key=value,...\" or the conf string of um_init):\n");
    for (int i = 0; i < n; i++) {
        um_option_info o;
        char value[300];
        um_status s = um_option_get(i, &o);
        if (s == UM_OK)
            s = um_option_current(ctx, i, value, sizeof value);
        if (s != UM_OK)
            return tool_fail("info", s);
        if (json) {
            printf("%s\n    {\"name\": ", i ? "," : "");
            tool_json_string(stdout, o.name);
            printf(", \"type\": ");
            tool_json_string(stdout, type_name(o.type));
            printf(", \"default\": ");
            tool_json_string(stdout, o.default_value);
            printf(", \"value\": ");
            tool_json_string(stdout, value);
            printf(", \"doc\": ");
            tool_json_string(stdout, o.doc);
            printf("}");
        } else {
            printf("  %-18s %-6s default %-7s now %-10s %s\n", o.name, type_name(o.type),
                   *o.default_value ? o.default_value : "\"\"", *value ? value : "\"\"", o.doc);
        }
    }
    if (json)
        printf("\n  ]");
    return 0;
}

int um_cmd_info(int argc, char **argv)
{
    bool options = false, json = false;
    const char *conf = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--options")) {
            options = true;
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--conf") && i + 1 < argc) {
            conf = argv[++i];
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            info_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "unimem info: unknown or incomplete argument '%s'\n", argv[i]);
            info_usage(stderr);
            return 2;
        }
    }
    /* With no configuration at all, show every device the machine has. */
    if (!conf && !getenv("UNIMEM_CONF"))
        conf = "devices=cuda";
    um_context *ctx = NULL;
    um_status s = um_init(conf, &ctx);
    if (s != UM_OK)
        return tool_init_fail("info", s);
    if (json)
        printf("{\n  \"version\": \"%d.%d.%d\",\n  \"build_features\": \"%s\",\n",
               UNIMEM_VERSION_MAJOR, UNIMEM_VERSION_MINOR, UNIMEM_VERSION_PATCH,
               um_build_features());
    else
        printf("unimem %d.%d.%d: %d device%s\nbuilt with: %s\n", UNIMEM_VERSION_MAJOR,
               UNIMEM_VERSION_MINOR, UNIMEM_VERSION_PATCH, um_device_count(ctx),
               um_device_count(ctx) == 1 ? "" : "s", um_build_features());
    int rc = print_devices(ctx, json);
    if (rc == 0)
        rc = print_cuda(ctx, json);
    if (rc == 0)
        rc = print_link_costs(ctx, json);
    if (rc == 0 && options)
        rc = print_options(ctx, json);
    if (json && rc == 0)
        printf("\n}\n");
    um_shutdown(ctx);
    return rc;
}
