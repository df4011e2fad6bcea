/*
 * alloc_compare's medians, checked without a GPU: the program's own code
 * (its main renamed), called on made-up samples. The paired scenario has
 * an even number of rounds (kPairedRounds, 8), whose median is the mean of
 * the two middle values; it once took the upper one, which leant the
 * paired ratio towards unimem and both allocators' ns towards the slower
 * rounds. Built and run by ctest where alloc_compare is built.
 */
#define main alloc_compare_main
#include "alloc_compare.cpp"
#undef main

static int g_bad = 0;

static void expect(bool ok, const char *what, double got, double want)
{
    if (!ok) {
        fprintf(stderr, "median_check: %s: got %g, want %g\n", what, got, want);
        g_bad = 1;
    }
}

int main()
{
    /* Eight rounds of 1,000 pairs, 1-8 us each (1-8 ns a pair), out of
     * order: the median is 4.5 ns, with 1,000 pairs. */
    std::vector<Sample> eight;
    for (int k : {3, 8, 1, 6, 2, 7, 5, 4})
        eight.push_back(Sample{1000, 1000.0 * k});
    Row r;
    set_median(r, eight);
    expect(r.ns_per_pair == 4.5, "set_median of 8 rounds", r.ns_per_pair, 4.5);
    expect(r.pairs == 1000, "pairs of the median", double(r.pairs), 1000);
    expect(r.ns_low == 1 && r.ns_high == 8, "lowest of 8 rounds", r.ns_low, 1);
    /* Three measurements (9, 2 and 5 ns a pair): the middle one itself. */
    std::vector<Sample> three{Sample{100, 900}, Sample{200, 400}, Sample{400, 2000}};
    Row t;
    set_median(t, three);
    expect(t.ns_per_pair == 5.0 && t.pairs == 400, "set_median of 3", t.ns_per_pair, 5.0);
    expect(median_of(three).pairs == 400, "median_of of 3", double(median_of(three).pairs), 400);
    /* The paired ratio: the median of the rounds' ratios. */
    std::vector<double> ratios{12.0, 9.0, 14.0, 10.0, 13.0, 11.0, 16.0, 8.0};
    double m = median_value(ratios);
    expect(m == 11.5, "median of 8 ratios", m, 11.5);
    if (!g_bad)
        printf("median_check: ok\n");
    return g_bad;
}
