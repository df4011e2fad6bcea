#!/bin/sh
# `unimem timeline` thins a device's counter samples above 500,000 to at
# most 500,000 on the page, keeping every series' peak, trough and final
# value exact. The trace is built so that each stretch of time the thinning
# groups has eight distinct samples worth keeping (first, last, and the
# lowest and highest of live, reserved and cached), which is where the cap
# once let about 571,000 through. Needs no browser: the page's series are
# read from the file.  Usage: timeline_thin_check.sh UNIMEM
set -u
U=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
N=571424
awk -v n=$N 'BEGIN {
    printf "{\"traceEvents\":[\n"
    for (i = 0; i < n; i++) {
        j = i % 8; l = 500; r = 5000; c = 50
        if (j == 1) l = 900; if (j == 2) l = 100
        if (j == 3) r = 9000; if (j == 4) r = 1000
        if (j == 5) c = 90; if (j == 6) c = 10
        printf "%s{\"ph\":\"C\",\"name\":\"memory\",\"pid\":1,\"ts\":%d,\"args\":{\"live\":%d,\"reserved\":%d,\"cached\":%d}}\n", (i ? "," : ""), i, l, r, c
    }
    print "]}"
}' > "$T/thin.json"
"$U" timeline "$T/thin.json" -o "$T/thin.html" > "$T/out.txt" 2>&1 || { cat "$T/out.txt"; exit 1; }
cat "$T/out.txt"
kept=$(sed -n 's/.*(\([0-9]*\) on the page, thinned).*/\1/p' "$T/out.txt")
status=0
if [ -z "$kept" ] || [ "$kept" -gt 500000 ] || [ "$kept" -lt 250000 ]; then
    echo "FAIL: $N samples should be thinned to between 250,000 and 500,000 on the page, got '${kept:-none}'"
    status=1
fi
# Each series is delta-coded on the page: add it up and take its extremes,
# its last value and its length.
for s in l:100:900:500 r:1000:9000:5000 c:10:90:50; do
    key=${s%%:*}
    want=${s#*:}
    got=$(grep -o "\"$key\":\[[^]]*\]" "$T/thin.html" | head -n 1 | sed 's/^[^[]*\[//; s/\]$//' | tr ',' '\n' |
        awk 'NR == 1 { v = $1; lo = v; hi = v; next } { v += $1; if (v < lo) lo = v; if (v > hi) hi = v }
             END { printf "%d:%d:%d", lo, hi, v }')
    if [ "$got" != "$want" ]; then
        echo "FAIL: series $key: low:high:last $got on the page, $want in the trace"
        status=1
    fi
done
[ $status = 0 ] && echo "timeline_thin_check: $kept of $N samples on the page, peaks and final values exact"
exit $status
