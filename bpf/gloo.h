/* Shared between bpf/gloo.bpf.c and agent/probes/gloo/layout.py
 * (ctypes mirror; sizes and offsets are checked at load time and in tests). */
#ifndef FABRICSCOPE_GLOO_H
#define FABRICSCOPE_GLOO_H

#include <linux/types.h>

/* collective ids (the `op` of an event); names in agent/probes/gloo/layout.py OPS */
#define FS_GLOO_ALLREDUCE 0
#define FS_GLOO_BROADCAST 1
#define FS_GLOO_ALLGATHER 2
#define FS_GLOO_ALLGATHERV 3
#define FS_GLOO_REDUCE 4
#define FS_GLOO_GATHER 5
#define FS_GLOO_SCATTER 6
#define FS_GLOO_ALLTOALL 7
#define FS_GLOO_ALLTOALLV 8
#define FS_GLOO_BARRIER 9
#define FS_GLOO_SEND 10     /* point to point: ProcessGroupGloo::send and its wait */
#define FS_GLOO_RECV 11     /* ... ProcessGroupGloo::recv and its wait */
#define FS_GLOO_NOPS 12

/* how an options object holds its output buffer (layout macro `out_kind`) */
#define FS_OUT_NONE 0      /* no output buffer read */
#define FS_OUT_PTR 1       /* std::unique_ptr<UnboundBuffer> */
#define FS_OUT_VEC 2       /* std::vector<std::unique_ptr<UnboundBuffer>>, first element */

/* event flags: what could not be read from user memory */
#define FS_F_NO_CONTEXT 1  /* options->context or context->rank/size */
#define FS_F_NO_COUNT 2    /* options->elements / elementSize */
#define FS_F_NO_OUT 4      /* output buffer size */
#define FS_F_NO_IN 8       /* input buffer size */

/* indexes of the per-CPU `stats` array; names in gloo_layout.STATS */
#define FS_GS_ENTRIES 0       /* collective entries of allowed processes */
#define FS_GS_EMITTED 1       /* events written to the ring buffer */
#define FS_GS_LOST 2          /* events lost: ring buffer full */
#define FS_GS_FILTERED 3      /* entries of processes outside this node (deny map) */
#define FS_GS_UNFINISHED 4    /* entries replaced before their return (exception unwind) */
#define FS_GS_ORPHAN_RET 5    /* returns without a recorded entry (attached mid-call) */
#define FS_GS_ACTIVE_FULL 6   /* entries not recorded: too many threads in collectives */
#define FS_GS_SENDS_OUTSIDE 7 /* UnboundBuffer::send outside a collective (p2p send) */
#define FS_GS_RECVS_OUTSIDE 8 /* UnboundBuffer::recv outside a collective (p2p recv) */
#define FS_GS_P2P_UNPAIRED 9  /* send/recv works made without their call seen (a recv from
			       * any source, or attached mid-call): no event */
#define FS_GS_P2P_UNWAITED 10 /* send/recv works freed before a wait on them returned (an
			       * isend never waited for): found when a new work reuses the
			       * address (the LRU map forgets the rest unseen) */
#define FS_GS_NOTICES_LOST 11 /* new processes not queued for user space (new_pids full) */
#define FS_GS_NSTATS 12

/* One collective as executed by one thread: entry to return of gloo::<op>(); or one
 * point-to-point transfer: its call to the return of its work's wait(). */
struct fs_gloo_event {
	__u64 start_ns;      /* bpf_ktime_get_ns at entry */
	__u64 end_ns;        /* at return */
	__u64 elements;      /* options.elements, where the op has one */
	__u64 elem_size;     /* options.elementSize */
	__u64 out_size;      /* output UnboundBuffer.size, bytes */
	__u64 in_size;       /* input UnboundBuffer.size, bytes (0 when none) */
	__u64 sent_bytes;    /* bytes posted with UnboundBuffer::send by this thread */
	__u64 recv_bytes;    /* bytes posted with UnboundBuffer::recv by this thread */
	__u32 pid;           /* tgid */
	__u32 tid;
	__u32 op;            /* FS_GLOO_* */
	__u32 sends;         /* UnboundBuffer::send calls */
	__u32 recvs;         /* UnboundBuffer::recv calls */
	__s32 ctx_rank;      /* options.context->rank */
	__s32 ctx_size;      /* options.context->size */
	__u32 flags;         /* FS_F_* */
	__s32 peer;          /* Send/Recv: the peer's rank in the process group; -1: none */
	__u32 pad;
};

#endif
