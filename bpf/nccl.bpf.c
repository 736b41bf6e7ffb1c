// SPDX-License-Identifier: Apache-2.0
/* nccl: one event per NCCL API call (collectives, point-to-point, groups, communicators).
 *
 * Hooks: a uprobe on each exported NCCL function of a libnccl.so file (the agent
 * attaches them per library file, for every process that maps it) and one shared
 * uretprobe. Reads only the uprobe registers and user memory (arguments passed
 * on the stack, the ncclComm_t written by init); no kernel struct.
 *
 * Arguments (x86-64 SysV): integer/pointer arguments 1-6 in registers; the 7th
 * and later on the stack above the return address (sp+8, sp+16, ...). The
 * 128-byte ncclUniqueId of ncclCommInitRank(Config) is a struct passed by value,
 * larger than 16 bytes, so it is passed in memory at sp+8 and takes no register:
 * `rank` is then the 3rd register argument.
 *
 * Timing: ts_ns is when the call was made and ret_ts_ns when it returned. NCCL
 * collectives return once enqueued on the CUDA stream, so this is ENQUEUE time,
 * not completion (the records say timing="enqueue").
 *
 * Entry and return are paired per thread in `inflight`; a probed function that
 * calls another probed function (ncclBcast calls ncclBroadcast through the PLT)
 * only raises the depth, so each API call is reported once.
 *
 * Options (cflags): -DRINGBUF_PAGES=n -DINFLIGHT_ENTRIES=n -DFS_NCCL_ENTRY_ONLY
 * (emit at entry, no return value or duration; for the overhead benchmark)
 * -DFS_NCCL_FILTER_PIDS (only processes in the `pids` map) -DMAX_PIDS=n
 */
#include <uapi/linux/ptrace.h>
#include "nccl.h"
#define FS_STATS_SLOTS FS_NCCL_NSTATS
#include "fs_common.h"

#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 64
#endif
#ifndef INFLIGHT_ENTRIES
#define INFLIGHT_ENTRIES 16384
#endif
#ifndef MAX_PIDS
#define MAX_PIDS 1024
#endif

BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);
BPF_ARRAY(seqno, __u64, 1);
/* LRU: an entry whose return never comes (process killed mid-call) ages out. */
BPF_TABLE("lru_hash", __u64, struct fs_nccl_inflight, inflight, INFLIGHT_ENTRIES);
#ifdef FS_NCCL_FILTER_PIDS
BPF_HASH(pids, __u32, __u8, MAX_PIDS);
#endif
/* Never written: exposes the event layout to the loader's size check. */
BPF_ARRAY(event_layout, struct fs_nccl_event, 1);

static __always_inline __u64 stack_arg(struct pt_regs *ctx, int n)
{
	/* n = 1 is the 7th argument: just above the return address */
	__u64 v = 0;
	bpf_probe_read_user(&v, sizeof(v), (void *)(PT_REGS_SP(ctx) + 8 * n));
	return v;
}

/* NCCL's getHash(id, 128) (src/include/bitops.h, eatHash + digestHash, NCCL >= 2.26):
 * the commId NCCL prints in its "Init START/COMPLETE" log lines. */
static __always_inline __u64 nccl_id_hash(const __u64 *w)
{
	__u64 a0 = 1 ^ 128, a1 = 1;

#pragma unroll
	for (int i = 0; i < 16; i++) {
		a0 += a1;
		a1 ^= a0;
		a0 ^= a0 >> 31;
		a0 *= 0x9de62bbc8cef3ce3ULL;
		a1 ^= a1 >> 32;
		a1 *= 0x485cd6311b599e79ULL;
		a0 += w[i];
	}
	a0 ^= a0 >> 31;
	a0 *= 0xbac3bd562846de6bULL;
	a0 += a1;
	a0 ^= a0 >> 32;
	a0 *= 0x995a187a14e7b445ULL;
	return a0;
}

static __always_inline void read_id(struct fs_nccl_event *ev, __u64 addr)
{
	__u64 w[16];

	if (addr && bpf_probe_read_user(w, sizeof(w), (void *)addr) == 0) {
		ev->id_hash = nccl_id_hash(w);
		ev->flags |= FS_NCCL_F_ID;
	} else {
		stat_add(FS_NCCL_STAT_ID_UNREADABLE, 1);
	}
}

static __always_inline void emit(struct fs_nccl_event *ev)
{
	fs_count_emit(events.ringbuf_output(ev, sizeof(*ev), 0), FS_NCCL_STAT_EMITTED,
		      FS_NCCL_STAT_LOST);
}

static __always_inline int wanted(__u64 id)
{
#ifdef FS_NCCL_FILTER_PIDS
	__u32 tgid = id >> 32;

	if (!pids.lookup(&tgid))
		return 0;
#endif
	return 1;
}

/* Start a call: 0 when it must not be recorded (filtered or nested). */
static __always_inline int begin(struct fs_nccl_inflight *in, int api)
{
	__u64 id = bpf_get_current_pid_tgid();

	stat_add(FS_NCCL_STAT_HITS, 1);
	if (!wanted(id)) {
		stat_add(FS_NCCL_STAT_FILTERED, 1);
		return 0;
	}
#ifndef FS_NCCL_ENTRY_ONLY
	struct fs_nccl_inflight *open = inflight.lookup(&id);
	if (open) {
		/* only this thread touches its entry: no atomics needed */
		open->depth += 1;
		stat_add(FS_NCCL_STAT_NESTED, 1);
		return 0;
	}
#endif
	in->ev.ts_ns = bpf_ktime_get_ns();
	in->ev.pid = id >> 32;
	in->ev.tid = (__u32)id;
	in->ev.api = api;
	in->ev.datatype = FS_NCCL_NONE;
	in->ev.redop = FS_NCCL_NONE;
	in->ev.peer = FS_NCCL_NONE;
	in->ev.nranks = FS_NCCL_NONE;
	in->ev.rank = FS_NCCL_NONE;
	in->ev.color = FS_NCCL_NONE;
	in->ev.key = FS_NCCL_NONE;
	in->depth = 1;
	return 1;
}

/* Finish the entry side: remember it until the return (or emit now). */
static __always_inline int enter(struct fs_nccl_inflight *in)
{
	int zero = 0;
	__u64 *seq = seqno.lookup(&zero);

	if (seq)
		in->ev.seq = __sync_fetch_and_add(seq, 1);
#ifdef FS_NCCL_ENTRY_ONLY
	emit(&in->ev);
#else
	__u64 id = bpf_get_current_pid_tgid();
	inflight.update(&id, in);
#endif
	return 0;
}

/* (sendbuff, recvbuff, count, datatype, op, comm, stream[, config]) */
static __always_inline int coll_redop(struct pt_regs *ctx, int api)
{
	struct fs_nccl_inflight in = {};

	if (!begin(&in, api))
		return 0;
	in.ev.count = PT_REGS_PARM3(ctx);
	in.ev.datatype = (int)PT_REGS_PARM4(ctx);
	in.ev.redop = (int)PT_REGS_PARM5(ctx);
	in.ev.comm = PT_REGS_PARM6(ctx);
	in.ev.stream = stack_arg(ctx, 1);
	return enter(&in);
}

/* (sendbuff, recvbuff, count, datatype, comm, stream[, config]) */
static __always_inline int coll(struct pt_regs *ctx, int api)
{
	struct fs_nccl_inflight in = {};

	if (!begin(&in, api))
		return 0;
	in.ev.count = PT_REGS_PARM3(ctx);
	in.ev.datatype = (int)PT_REGS_PARM4(ctx);
	in.ev.comm = PT_REGS_PARM5(ctx);
	in.ev.stream = PT_REGS_PARM6(ctx);
	return enter(&in);
}

/* (sendbuff, recvbuff, count, datatype, root, comm, stream[, config]) */
static __always_inline int rooted(struct pt_regs *ctx, int api)
{
	struct fs_nccl_inflight in = {};

	if (!begin(&in, api))
		return 0;
	in.ev.count = PT_REGS_PARM3(ctx);
	in.ev.datatype = (int)PT_REGS_PARM4(ctx);
	in.ev.peer = (int)PT_REGS_PARM5(ctx);
	in.ev.comm = PT_REGS_PARM6(ctx);
	in.ev.stream = stack_arg(ctx, 1);
	return enter(&in);
}

/* (sendbuff, recvbuff, count, datatype, op, root, comm, stream[, config]) */
static __always_inline int reduce(struct pt_regs *ctx, int api)
{
	struct fs_nccl_inflight in = {};

	if (!begin(&in, api))
		return 0;
	in.ev.count = PT_REGS_PARM3(ctx);
	in.ev.datatype = (int)PT_REGS_PARM4(ctx);
	in.ev.redop = (int)PT_REGS_PARM5(ctx);
	in.ev.peer = (int)PT_REGS_PARM6(ctx);
	in.ev.comm = stack_arg(ctx, 1);
	in.ev.stream = stack_arg(ctx, 2);
	return enter(&in);
}

/* (buff, count, datatype, peer_or_root, comm, stream): Send, Recv, Bcast */
static __always_inline int p2p(struct pt_regs *ctx, int api)
{
	struct fs_nccl_inflight in = {};

	if (!begin(&in, api))
		return 0;
	in.ev.count = PT_REGS_PARM2(ctx);
	in.ev.datatype = (int)PT_REGS_PARM3(ctx);
	in.ev.peer = (int)PT_REGS_PARM4(ctx);
	in.ev.comm = PT_REGS_PARM5(ctx);
	in.ev.stream = PT_REGS_PARM6(ctx);
	return enter(&in);
}

/* () : GroupStart, GroupEnd */
static __always_inline int noargs(struct pt_regs *ctx, int api)
{
	struct fs_nccl_inflight in = {};

	if (!begin(&in, api))
		return 0;
	return enter(&in);
}

/* (ncclComm_t *comm, int nranks, ncclUniqueId id (on the stack), int rank[, config]) */
static __always_inline int init_rank(struct pt_regs *ctx, int api)
{
	struct fs_nccl_inflight in = {};

	if (!begin(&in, api))
		return 0;
	in.ev.aux = PT_REGS_PARM1(ctx);
	in.ev.flags |= FS_NCCL_F_OUT;
	in.ev.nranks = (int)PT_REGS_PARM2(ctx);
	in.ev.rank = (int)PT_REGS_PARM3(ctx);
	read_id(&in.ev, PT_REGS_SP(ctx) + 8);
	return enter(&in);
}

/* (ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds, config) */
static __always_inline int init_scalable(struct pt_regs *ctx, int api)
{
	struct fs_nccl_inflight in = {};

	if (!begin(&in, api))
		return 0;
	in.ev.aux = PT_REGS_PARM1(ctx);
	in.ev.flags |= FS_NCCL_F_OUT;
	in.ev.nranks = (int)PT_REGS_PARM2(ctx);
	in.ev.rank = (int)PT_REGS_PARM3(ctx);
	in.ev.color = (int)PT_REGS_PARM4(ctx);
	read_id(&in.ev, PT_REGS_PARM5(ctx));   /* the first id; NCCL hashes that one */
	return enter(&in);
}

/* (ncclComm_t comm, int color, int key, ncclComm_t *newcomm, config) */
static __always_inline int split(struct pt_regs *ctx, int api)
{
	struct fs_nccl_inflight in = {};

	if (!begin(&in, api))
		return 0;
	in.ev.parent = PT_REGS_PARM1(ctx);
	in.ev.color = (int)PT_REGS_PARM2(ctx);
	in.ev.key = (int)PT_REGS_PARM3(ctx);
	in.ev.aux = PT_REGS_PARM4(ctx);
	in.ev.flags |= FS_NCCL_F_OUT;
	return enter(&in);
}

/* (ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm, ...) */
static __always_inline int shrink(struct pt_regs *ctx, int api)
{
	struct fs_nccl_inflight in = {};

	if (!begin(&in, api))
		return 0;
	in.ev.parent = PT_REGS_PARM1(ctx);
	in.ev.color = (int)PT_REGS_PARM3(ctx);
	in.ev.aux = PT_REGS_PARM4(ctx);
	in.ev.flags |= FS_NCCL_F_OUT;
	return enter(&in);
}

/* (ncclComm_t comm, int nRanks, const ncclUniqueId *id, int rank, ncclComm_t *newcomm, config) */
static __always_inline int grow(struct pt_regs *ctx, int api)
{
	struct fs_nccl_inflight in = {};

	if (!begin(&in, api))
		return 0;
	in.ev.parent = PT_REGS_PARM1(ctx);
	in.ev.nranks = (int)PT_REGS_PARM2(ctx);
	if (PT_REGS_PARM3(ctx))   /* NULL on ranks already in the parent */
		read_id(&in.ev, PT_REGS_PARM3(ctx));
	in.ev.rank = (int)PT_REGS_PARM4(ctx);
	in.ev.aux = PT_REGS_PARM5(ctx);
	in.ev.flags |= FS_NCCL_F_OUT;
	return enter(&in);
}

/* (ncclComm_t comm): Destroy, Abort, Finalize */
static __always_inline int comm_only(struct pt_regs *ctx, int api)
{
	struct fs_nccl_inflight in = {};

	if (!begin(&in, api))
		return 0;
	in.ev.comm = PT_REGS_PARM1(ctx);
	return enter(&in);
}

/* One entry function per symbol, named enter_<symbol> (the loader relies on it). */
#define ENTRY(sym, layout, api) \
	int enter_##sym(struct pt_regs *ctx) { return layout(ctx, api); }

ENTRY(ncclAllReduce, coll_redop, FS_NCCL_API_ALLREDUCE)
ENTRY(ncclAllReduceConfig, coll_redop, FS_NCCL_API_ALLREDUCE_CONFIG)
ENTRY(ncclReduceScatter, coll_redop, FS_NCCL_API_REDUCESCATTER)
ENTRY(ncclReduceScatterConfig, coll_redop, FS_NCCL_API_REDUCESCATTER_CONFIG)
ENTRY(ncclAllGather, coll, FS_NCCL_API_ALLGATHER)
ENTRY(ncclAllGatherConfig, coll, FS_NCCL_API_ALLGATHER_CONFIG)
ENTRY(ncclAlltoAll, coll, FS_NCCL_API_ALLTOALL)
ENTRY(ncclAlltoAllConfig, coll, FS_NCCL_API_ALLTOALL_CONFIG)
ENTRY(ncclBroadcast, rooted, FS_NCCL_API_BROADCAST)
ENTRY(ncclBroadcastConfig, rooted, FS_NCCL_API_BROADCAST_CONFIG)
ENTRY(ncclBcast, p2p, FS_NCCL_API_BCAST)
ENTRY(ncclReduce, reduce, FS_NCCL_API_REDUCE)
ENTRY(ncclReduceConfig, reduce, FS_NCCL_API_REDUCE_CONFIG)
ENTRY(ncclGather, rooted, FS_NCCL_API_GATHER)
ENTRY(ncclGatherConfig, rooted, FS_NCCL_API_GATHER_CONFIG)
ENTRY(ncclScatter, rooted, FS_NCCL_API_SCATTER)
ENTRY(ncclScatterConfig, rooted, FS_NCCL_API_SCATTER_CONFIG)
ENTRY(ncclSend, p2p, FS_NCCL_API_SEND)
ENTRY(ncclRecv, p2p, FS_NCCL_API_RECV)
ENTRY(ncclGroupStart, noargs, FS_NCCL_API_GROUP_START)
ENTRY(ncclGroupEnd, noargs, FS_NCCL_API_GROUP_END)
ENTRY(ncclCommInitRank, init_rank, FS_NCCL_API_COMM_INIT_RANK)
ENTRY(ncclCommInitRankConfig, init_rank, FS_NCCL_API_COMM_INIT_RANK_CONFIG)
ENTRY(ncclCommInitRankScalable, init_scalable, FS_NCCL_API_COMM_INIT_RANK_SCALABLE)
ENTRY(ncclCommSplit, split, FS_NCCL_API_COMM_SPLIT)
ENTRY(ncclCommShrink, shrink, FS_NCCL_API_COMM_SHRINK)
ENTRY(ncclCommGrow, grow, FS_NCCL_API_COMM_GROW)
ENTRY(ncclCommDestroy, comm_only, FS_NCCL_API_COMM_DESTROY)
ENTRY(ncclCommAbort, comm_only, FS_NCCL_API_COMM_ABORT)
ENTRY(ncclCommFinalize, comm_only, FS_NCCL_API_COMM_FINALIZE)

/* The uretprobe of every symbol: pair with the thread's open call and emit it. */
int nccl_return(struct pt_regs *ctx)
{
#ifndef FS_NCCL_ENTRY_ONLY
	__u64 id = bpf_get_current_pid_tgid();
	struct fs_nccl_inflight *open = inflight.lookup(&id);
	struct fs_nccl_event ev;

	if (!open) {
		if (wanted(id))
			stat_add(FS_NCCL_STAT_ORPHAN, 1);
		return 0;
	}
	if (open->depth > 1) {
		open->depth -= 1;
		return 0;
	}
	__builtin_memcpy(&ev, &open->ev, sizeof(ev));
	inflight.delete(&id);
	ev.ret_ts_ns = bpf_ktime_get_ns();
	ev.ret = (int)PT_REGS_RC(ctx);
	ev.flags |= FS_NCCL_F_RETURNED;
	if ((ev.flags & FS_NCCL_F_OUT) && ev.aux) {
		__u64 comm = 0;

		/* the out argument is written by now (also NULL on failure) */
		bpf_probe_read_user(&comm, sizeof(comm), (void *)ev.aux);
		ev.comm = comm;
	}
	emit(&ev);
#endif
	return 0;
}
