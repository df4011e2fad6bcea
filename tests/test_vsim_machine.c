/* Tests of the simulator's machine descriptions (src/vsim/machine.c): the
 * built-ins' devices, links and routes, compute times from measured points,
 * rates and fits, and every kind of bad description, each named with its
 * line and key. */
#include "harness.h"
#include "vsim/machine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GiB (1024.0 * 1024.0 * 1024.0)

static um__vs_machine *machine(void)
{
    um__vs_machine *m = malloc(sizeof *m);
    if (!m) {
        fprintf(stderr, "test_vsim_machine: out of memory\n");
        exit(1);
    }
    return m;
}

static int route(const um__vs_machine *m, int a, int b, int r[4], double *lat)
{
    return um__vs_route(m, a, b, r, lat);
}

static void test_h200x8(void)
{
    um__vs_machine *m = machine();
    CHECK_OK(um__vs_machine_load("h200x8", m));
    CHECK(!strcmp(m->name, "h200x8"));
    CHECK_EQ(m->ndev, 9);
    CHECK(m->dev[0].host && !strcmp(m->dev[0].name, "host"));
    CHECK(!strcmp(m->dev[1].name, "gpu0") && !strcmp(m->dev[8].name, "gpu7"));
    CHECK_EQ(m->dev[3].memory, (uint64_t)(141 * GiB));
    CHECK_EQ(m->dev[3].granularity, 2u << 20);
    /* One resource per host link and direction, two ports per GPU. */
    CHECK_EQ(m->nres, 8 + 8 + 16);
    int r[4];
    double lat;
    CHECK_EQ(route(m, 0, 3, r, &lat), 1);
    CHECK_NEAR(m->res_bandwidth[r[0]], 55e9, 1e-12);
    CHECK_NEAR(lat, 10e-6, 1e-12);
    int down3 = r[0];
    CHECK_EQ(route(m, 0, 4, r, &lat), 1);
    CHECK(r[0] != down3); /* each GPU its own host link */
    CHECK_EQ(route(m, 1, 4, r, &lat), 2);
    CHECK(!strcmp(m->res_name[r[0]], "gpu0 out") && !strcmp(m->res_name[r[1]], "gpu3 in"));
    CHECK_NEAR(m->res_bandwidth[r[1]], 450e9, 1e-12);
    CHECK_NEAR(lat, 5e-6, 1e-12);
    int in3 = r[1];
    CHECK_EQ(route(m, 2, 4, r, &lat), 2);
    CHECK_EQ(r[1], in3); /* two copies into gpu3 share its port */
    CHECK_EQ(route(m, 5, 5, r, &lat), 0);
    CHECK_EQ(route(m, 0, 9, r, &lat), -1);

    /* The measured points themselves, the power law between and beyond. */
    CHECK_NEAR(um__vs_compute_time(m, 1, UM_VS_GEMM, 8192, 0), 21.7199e-3, 1e-12);
    CHECK_NEAR(um__vs_packed_time(m, 1, UM_VS_GEMM, 8192, 0), 20.9372e-3, 1e-12);
    CHECK_NEAR(um__vs_packed_time(m, 1, UM_VS_POTRF, 8192, 0), 7.6912e-3, 1e-12);
    CHECK_NEAR(um__vs_compute_time(m, 8, UM_VS_POTRF, 1024, 0), 0.3374e-3, 1e-12);
    double e = log(21.7199 / 2.7716) / log(2.0);
    CHECK_NEAR(um__vs_compute_time(m, 1, UM_VS_GEMM, 6000, 0), 2.7716e-3 * pow(6000 / 4096.0, e),
               1e-12);
    CHECK_NEAR(um__vs_compute_time(m, 1, UM_VS_GEMM, 16384, 0), 21.7199e-3 * pow(2.0, e), 1e-12);
    double e0 = log(0.7712 / 0.3195) / log(2.0);
    CHECK_NEAR(um__vs_compute_time(m, 1, UM_VS_TRSM, 512, 0), 0.3195e-3 * pow(0.5, e0), 1e-12);
    CHECK(isinf(um__vs_compute_time(m, 0, UM_VS_GEMM, 8192, 0))); /* the host has no model */
    CHECK(isinf(um__vs_compute_time(m, 1, UM_VS_NKERNELS, 8192, 0)));
    free(m);
}

static void test_pcie4x4(void)
{
    um__vs_machine *m = machine();
    CHECK_OK(um__vs_machine_load("pcie4x4", m));
    CHECK_EQ(m->ndev, 5);
    CHECK_EQ(m->nres, 2); /* one shared link each way */
    int r[4], r2[4];
    double lat;
    CHECK_EQ(route(m, 0, 1, r, &lat), 1);
    CHECK_EQ(route(m, 0, 4, r2, &lat), 1);
    CHECK_EQ(r[0], r2[0]);
    CHECK_NEAR(m->res_bandwidth[r[0]], 25e9, 1e-12);
    CHECK_EQ(m->dev[2].memory, (uint64_t)(24 * GiB));
    /* No peer access: GPU to GPU goes up to the host and down again. */
    CHECK_EQ(route(m, 1, 3, r, &lat), 2);
    CHECK(!strcmp(m->res_name[r[0]], "pcie_up") && !strcmp(m->res_name[r[1]], "pcie_down"));
    CHECK_NEAR(lat, 20e-6, 1e-12);
    um__vs_machine *one = machine();
    CHECK_OK(um__vs_machine_load("h200x1", one));
    CHECK_EQ(one->ndev, 2);
    CHECK(!strcmp(one->dev[1].name, "gpu0"));
    free(one);
    free(m);
}

static void test_forms(void)
{
    const char *text = "machine name=tiny # a comment\n"
                       "\n"
                       "device name=host kind=host memory=64G model=cpu\n"
                       "device name=acc kind=gpu memory=1.5G granularity=64K model=acc\n"
                       "link from=host to=acc bandwidth=10G latency=1ms\n"
                       "link from=acc to=host bandwidth=8G latency=0.5s\n"
                       "compute model=cpu kernel=gemm gflops=500\n"
                       "compute model=acc kernel=gemm fit=1e-12,3,0.001\n"
                       "compute model=acc kernel=syrk tile=1000 seconds=2ms\n"
                       "compute model=acc kernel=trsm tile=1000 seconds=2ms packed=1ms\n"
                       "compute model=acc kernel=trsm tile=2000 seconds=16ms\n";
    um__vs_machine *m = machine();
    CHECK_OK(um__vs_machine_parse(text, "tiny.machine", m));
    CHECK(!strcmp(m->name, "tiny") && !strcmp(m->dev[1].name, "acc"));
    CHECK_EQ(m->dev[1].memory, 1610612736u);
    CHECK_EQ(m->dev[1].granularity, 65536u);
    int r[4];
    double lat;
    CHECK_EQ(route(m, 1, 0, r, &lat), 1);
    CHECK_NEAR(m->res_bandwidth[r[0]], 8e9, 1e-12);
    CHECK_NEAR(lat, 0.5, 1e-12);
    CHECK_NEAR(um__vs_compute_time(m, 0, UM_VS_GEMM, 4096, 1e12), 2.0, 1e-12);
    CHECK_NEAR(um__vs_compute_time(m, 1, UM_VS_GEMM, 1000, 0), 1e-12 * 1e9 + 0.001, 1e-12);
    /* One point: the time grows as tile^3. */
    CHECK_NEAR(um__vs_compute_time(m, 1, UM_VS_SYRK, 2000, 0), 16e-3, 1e-12);
    CHECK(isinf(um__vs_compute_time(m, 1, UM_VS_POTRF, 1000, 0)));
    /* packed=: its own points (seconds= where a point has none), and the
     * time alone elsewhere. */
    CHECK_NEAR(um__vs_packed_time(m, 1, UM_VS_TRSM, 1000, 0), 1e-3, 1e-12);
    CHECK_NEAR(um__vs_compute_time(m, 1, UM_VS_TRSM, 1000, 0), 2e-3, 1e-12);
    CHECK_NEAR(um__vs_packed_time(m, 1, UM_VS_TRSM, 2000, 0), 16e-3, 1e-12);
    CHECK_NEAR(um__vs_packed_time(m, 1, UM_VS_TRSM, 4000, 0), 16e-3 * 16.0, 1e-12);
    CHECK_NEAR(um__vs_packed_time(m, 1, UM_VS_SYRK, 2000, 0), 16e-3, 1e-12);
    CHECK_NEAR(um__vs_packed_time(m, 1, UM_VS_GEMM, 1000, 0), 1e-12 * 1e9 + 0.001, 1e-12);
    free(m);

    /* A fit whose value underflows to 0 (or overflows) gives no time:
     * the device cannot run the kernel there. The bounds are inclusive. */
    m = machine();
    CHECK_OK(um__vs_machine_parse("device name=host kind=host memory=1G\n"
                                  "device name=g kind=gpu memory=1G granularity=1G model=f\n"
                                  "link from=host to=g bandwidth=1G latency=1e6s\n"
                                  "link from=g to=host bandwidth=1G latency=1000000\n"
                                  "compute model=f kernel=gemm fit=1e-300,-100,0\n"
                                  "compute model=f kernel=trsm fit=1e300,300,0\n"
                                  "compute model=f kernel=syrk fit=0,7,1e6\n"
                                  "compute model=f kernel=potrf tile=4 seconds=1e6s\n",
                                  "fits", m));
    CHECK(isinf(um__vs_compute_time(m, 1, UM_VS_GEMM, 1000, 0)));
    CHECK(isinf(um__vs_packed_time(m, 1, UM_VS_GEMM, 1000, 0)));
    CHECK(isinf(um__vs_compute_time(m, 1, UM_VS_TRSM, 1000, 0)));
    CHECK_NEAR(um__vs_compute_time(m, 1, UM_VS_SYRK, 1000, 0), 1e6, 0);
    CHECK_NEAR(um__vs_compute_time(m, 1, UM_VS_POTRF, 4, 0), 1e6, 0);
    free(m);

    /* A description file, and a name that is neither. */
    char path[] = "/tmp/test_vsim_machine_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) {
        CHECK_EQ(write(fd, text, strlen(text)), strlen(text));
        close(fd);
        m = machine();
        CHECK_OK(um__vs_machine_load(path, m));
        CHECK_EQ(m->ndev, 2);
        free(m);
        unlink(path);
    }
    m = machine();
    CHECK_STATUS(um__vs_machine_load("/nonexistent/h200x9", m), UM_ERR_IO);
    CHECK_ERROR_MENTIONS("h200x9", "h200x8", "pcie4x4");
    free(m);
}

/* Each bad description fails with UM_ERR_PARSE, and the message names
 * the line and the offending word. */
static void test_errors(void)
{
    static const char *head = "device name=host kind=host memory=1G\n"
                              "device name=gpu count=2 kind=gpu memory=1G model=g\n";
    static const struct {
        const char *body, *want1, *want2;
    } cases[] = {
        {"link from=host to=gpu bandwidth=1G colour=red\n", "line 3", "colour"},
        {"lnik from=host to=gpu bandwidth=1G\n", "line 3", "lnik"},
        {"link from=host to=gpu bandwidth=fast\n", "line 3", "fast"},
        {"link from=host to=gpu bandwidth=1G latency=3h\n", "line 3", "3h"},
        {"link from=host to=gpu\n", "line 3", "bandwidth"},
        {"link from=host to=gpu bandwidth=1G\nlink from=host to=gpu1 bandwidth=1G\n", "line 4",
         "given twice"},
        {"link from=host to=tpu bandwidth=1G\n", "line 3", "tpu"},
        {"link from=gpu0 to=gpu0 bandwidth=1G\n", "line 3", "no two different"},
        {"link from=host to=gpu bandwidth=1G shared=s\nlink from=gpu to=host bandwidth=2G "
         "shared=s\n",
         "line 4", "another bandwidth"},
        {"link from=host to=gpu bandwidth=1G shared=s switched=1\n", "line 3", "not both"},
        {"compute model=g kernel=fft gflops=1\n", "line 3", "fft"},
        {"compute model=g kernel=gemm tile=64\n", "line 3", "both tile"},
        {"compute model=g kernel=gemm tile=64 seconds=1ms\ncompute model=g kernel=gemm "
         "tile=64 seconds=2ms\n",
         "line 4", "given twice"},
        /* A rate or a fit given again for one kernel and model replaced
         * the first silently (a second point of one tile is refused). */
        {"compute model=g kernel=gemm gflops=5\ncompute model=g kernel=gemm gflops=50\n",
         "line 4", "given twice"},
        {"compute model=g kernel=gemm fit=1,1,0\ncompute model=g kernel=gemm fit=2,1,0\n",
         "line 4", "given twice"},
        /* So did a second machine line's name. */
        {"machine name=a\nmachine name=b\n", "line 4", "given twice"},
        {"compute model=g kernel=gemm gflops=1 fit=1,2,3\n", "line 3", "compute line"},
        {"compute model=g kernel=gemm fit=1,x\n", "line 3", "fit"},
        {"compute model=g kernel=gemm tile=8 seconds=1s packed=0\n", "line 3", "packed"},
        {"compute model=g kernel=gemm gflops=1 packed=1s\n", "line 3", "measured point"},
        {"compute model=g kernel=gemm gflops=1\ncompute model=g kernel=gemm tile=8 "
         "seconds=1s\n",
         "line 4", "two forms"},
        {"device name=host kind=host memory=1G\n", "line 3", "only the first"},
        {"device name=gpu kind=gpu memory=1G\n", "line 3", "used twice"},
        {"device name=x kind=tpu memory=1G\n", "line 3", "host, gpu or sim, not 'tpu'"},
        {"device name=x kind=gpu memory=lots\n", "line 3", "memory"},
        {"device name=x kind=gpu count=0 memory=1G\n", "line 3", "count"},
        {"device name=x kind=gpu count=70 memory=1G\n", "line 3", "count"},
        {"link from=host to=gpu bandwidth=1G key=a key=b\n", "line 3", "twice"},
        {"link from=host to=gpu bandwidth=1G\n", "gpu0", "no link"},
        /* A fit needs three numbers, a >= 0, c >= 0 and a + c > 0. */
        {"compute model=g kernel=gemm fit=,\n", "line 3", "fit ','"},
        {"compute model=g kernel=gemm fit=1,,\n", "line 3", "fit '1,,'"},
        {"compute model=g kernel=gemm fit=1,3\n", "line 3", "fit '1,3'"},
        {"compute model=g kernel=gemm fit=1,3,0,\n", "line 3", "fit '1,3,0,'"},
        {"compute model=g kernel=gemm fit=-1,0,0\n", "line 3", "fit '-1,0,0'"},
        {"compute model=g kernel=gemm fit=1,3,-1\n", "line 3", "fit '1,3,-1'"},
        {"compute model=g kernel=gemm fit=0,3,0\n", "line 3", "fit '0,3,0'"},
        {"compute model=g kernel=gemm fit=1,3,2e6\n", "line 3", "fit '1,3,2e6'"},
        /* Times above 1e6 s are refused (UM_VS_MAX_SECONDS). */
        {"link from=host to=gpu bandwidth=1G latency=1.5e6s\n", "line 3", "latency '1.5e6s'"},
        {"compute model=g kernel=gemm tile=8 seconds=2e6\n", "line 3", "seconds '2e6'"},
        {"compute model=g kernel=gemm tile=8 seconds=1 packed=2e6\n", "line 3", "packed '2e6'"},
        /* A device's name may not be another's, nor a group's member's. */
        {"device name=gpu0 kind=gpu memory=1G\n", "line 3", "'gpu0' is used twice"},
        {"device name=gpu0 count=2 kind=sim memory=1G\n", "line 3", "'gpu0' is used twice"},
        {"device name=x10 kind=sim memory=1G\ndevice name=x count=11 kind=sim memory=1G\n",
         "line 4", "'x10' is used twice"},
        /* A granularity is a power of two, at most the memory. */
        {"device name=x kind=gpu memory=1G granularity=3\n", "line 3", "granularity"},
        {"device name=x kind=gpu memory=1G granularity=2G\n", "line 3", "more than the memory"},
        /* A rate that overflows once scaled is no rate (it was taken as
         * infinite, and the engines failed later with "no memory"). */
        {"link from=host to=gpu bandwidth=1e300T\n", "line 3", "bandwidth '1e300T'"},
        {"compute model=g kernel=gemm gflops=1e300T\n", "line 3", "gflops '1e300T'"},
        {"compute model=g kernel=gemm gflops=1e300\n", "line 3", "gflops '1e300'"},
        /* A shared name that is a link's own (FROM->TO) joined that link. */
        {"link from=gpu to=host bandwidth=1G\nlink from=host to=gpu bandwidth=1G "
         "shared=gpu0->host\n",
         "line 4", "'gpu0->host'"},
        {"device name=a->b kind=sim memory=1G\ndevice name=a kind=sim memory=1G\n"
         "device name=b->c kind=sim memory=1G\ndevice name=c kind=sim memory=1G\n"
         "link from=a to=b->c bandwidth=1G\nlink from=a->b to=c bandwidth=1G\n",
         "line 8", "'a->b->c' is named twice"},
    };
    um__vs_machine *m = machine();
    char text[1024];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(text, sizeof text, "%s%s", head, cases[i].body);
        CHECK_STATUS(um__vs_machine_parse(text, "bad.machine", m), UM_ERR_PARSE);
        CHECK_ERROR_MENTIONS("bad.machine", cases[i].want1, cases[i].want2);
    }
    CHECK_STATUS(um__vs_machine_parse("device name=gpu kind=gpu memory=1G\n", "x", m),
                 UM_ERR_PARSE);
    CHECK_ERROR_MENTIONS("line 1", "must be the host", NULL);
    CHECK_STATUS(um__vs_machine_parse("# nothing\n", "empty", m), UM_ERR_PARSE);
    CHECK_ERROR_MENTIONS("empty", "at least one gpu", NULL);
    free(m);
}

/* A task of another name runs at the model's gemm rate for its flops,
 * also where that gemm is given as a rate (it took 0 s there: the gemm's
 * time was asked for 0 flops). */
static void test_other_at_gemm_rate(void)
{
    um__vs_machine *m = machine();
    CHECK_OK(um__vs_machine_parse("device name=host kind=host memory=64G\n"
                                  "device name=gpu kind=gpu memory=16G model=g\n"
                                  "link from=host to=gpu bandwidth=10G\n"
                                  "link from=gpu to=host bandwidth=10G\n"
                                  "compute model=g kernel=gemm gflops=1000\n",
                                  "rate", m));
    CHECK_NEAR(um__vs_compute_time(m, 1, UM_VS_OTHER, 1024, 1e12), 1.0, 1e-12);
    CHECK_NEAR(um__vs_packed_time(m, 1, UM_VS_OTHER, 1024, 5e11), 0.5, 1e-12);
    CHECK_NEAR(um__vs_compute_time(m, 1, UM_VS_OTHER, 0, 2e9), 2e-3, 1e-15);
    free(m);
}

int main(void)
{
    test_h200x8();
    test_pcie4x4();
    test_forms();
    test_errors();
    test_other_at_gemm_rate();
    return harness_finish("test_vsim_machine");
}
