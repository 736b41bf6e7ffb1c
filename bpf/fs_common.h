/* SPDX-License-Identifier: Apache-2.0 */
/* Pieces every fabricscope BPF program shares: its counters, the counting of the
 * events it sends to user space, and log2 buckets.
 *
 * Counters: each program counts into one per-CPU array, `stats`, of
 * FS_STATS_SLOTS entries, which its loader sums over CPUs
 * (agent.bpf.percpu_sums). A program defines FS_STATS_SLOTS (the number of its
 * counters, from its own header) before it includes this file.
 *
 * Events: rare single events go through BPF ring buffers, and every event is
 * counted as emitted or lost (buffer full). BCC rewrites map methods only
 * outside macros and only in the main file (agent.bpf.inline_includes pastes
 * this one in), so the ring call stays at each call site and its result is
 * counted here:
 *
 *	fs_count_emit(events.ringbuf_output(ev, sizeof(*ev), 0), EMITTED, LOST);
 */
#ifndef FABRICSCOPE_FS_COMMON_H
#define FABRICSCOPE_FS_COMMON_H

#ifndef FS_STATS_SLOTS
#error "define FS_STATS_SLOTS (the program's number of counters) before fs_common.h"
#endif

BPF_PERCPU_ARRAY(stats, __u64, FS_STATS_SLOTS);

static __always_inline void stat_add(int idx, __u64 n)
{
	__u64 *v = stats.lookup(&idx);
	if (v)
		*v += n;
}

/* `err` is what ringbuf_output returned: 0 sent, else the event is lost. (Two
 * calls with constant slots, not one with a computed slot: TC egress of tcp_flows
 * has no stack byte to spare for the extra key.) */
static __always_inline void fs_count_emit(long err, int emitted, int lost)
{
	if (err == 0)
		stat_add(emitted, 1);
	else
		stat_add(lost, 1);
}

/* floor(log2(v)), 0 for 0 and 1: bucket i holds [2^i, 2^(i+1)). */
static __always_inline __u32 fs_log2(__u64 v)
{
	__u32 r = 0;

	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) { r += 1; }
	return r;
}

#endif
