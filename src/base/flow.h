/*
 * flow: the network model of virtual time (the simulator, src/vsim, and the
 * runtime run in virtual time, src/backend/vdev.c). A net owns a
 * set of link resources, each with a capacity in bytes per second, and the
 * flows (copies) in flight over routes of those resources. A flow first
 * spends a fixed latency taking no bandwidth, then transfers its bytes; the
 * transferring flows share every resource by max-min fairness, computed by
 * progressive filling (as SimGrid's flow model does) whenever a flow enters
 * its transfer phase or completes. Rates are constant between events, so
 * time is a double in seconds that moves only from event to event, as the
 * caller drives it: there is no clock, no thread and no sleeping.
 */
#ifndef UM_VSIM_FLOW_H
#define UM_VSIM_FLOW_H

#include <stdint.h>

typedef struct um__vs_net um__vs_net;

/* nres (>= 0) resources with capacity[i] bytes per second (finite, > 0).
 * NULL on bad input or no memory. The net's time starts at 0. */
um__vs_net *um__vs_net_create(int nres, const double *capacity);
void um__vs_net_destroy(um__vs_net *n);

/* Starts a flow at time `now` (>= the net's current time) of `bytes` (>= 0)
 * over the resources route[0..nroute-1] (nroute >= 0; nroute 0 or bytes 0
 * means it needs no bandwidth and completes when its latency ends) after a
 * fixed latency of latency_s seconds (>= 0) during which it takes no
 * bandwidth. A route may name a resource more than once: the flow then
 * takes its rate there once for each time (a copy that crosses a shared bus
 * twice), and its bytes count as often. tag is the caller's.
 * Starting first advances the net to `now`, processing every event up to it
 * (flows that complete meanwhile wait to be reported by
 * um__vs_net_advance). Returns 0, or -1 for bad arguments (a resource index
 * out of range, negative or non-finite values, now earlier than
 * the current time) or no memory, leaving the net unchanged. */
int um__vs_net_start(um__vs_net *n, double now, const int *route, int nroute, double bytes,
                     double latency_s, uint64_t tag);

/* Absolute time of the next event: the earliest completion or end of a
 * latency phase; the current time while completed flows wait to be
 * reported; INFINITY when no flow is active. */
double um__vs_net_next(const um__vs_net *n);

/* Advances to time t (>= the current time), processing every event up to t
 * in order, and writes the tags of flows that completed at or before t into
 * done[0..max-1] in completion order (simultaneous completions in start
 * order). Returns how many it wrote; flows beyond max stay "completed, not
 * yet reported" for the next call. t = INFINITY runs every flow to its end
 * and leaves the time at the last event. -1 (net unchanged) when t is NaN or
 * earlier than the current time, max < 0, or done is NULL with max > 0. A
 * flow completes when what is left of it is within 1e-9 of its size or
 * 1e-12 s of transfer, so floating error never leaves a sliver of bytes. */
int um__vs_net_advance(um__vs_net *n, double t, uint64_t *done, int max);

double um__vs_net_now(const um__vs_net *n);
/* Flows started and not yet reported done. */
int um__vs_net_active(const um__vs_net *n);
/* Current rate in bytes/s of the active flow with this tag (the first
 * started in flight, if several share it): 0 in its latency phase or once
 * completed but not yet reported; -1 if no active flow has the tag. */
double um__vs_net_rate(const um__vs_net *n, uint64_t tag);
/* Bytes that crossed resource res so far (progress counted continuously);
 * -1 for a bad index. */
double um__vs_net_bytes(const um__vs_net *n, int res);
/* Seconds during which resource res carried at least one transferring flow;
 * -1 for a bad index. */
double um__vs_net_busy(const um__vs_net *n, int res);

#endif
