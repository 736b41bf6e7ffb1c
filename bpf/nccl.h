/* Shared between bpf/nccl.bpf.c and agent/probes/nccl/layout.py (ctypes mirror;
 * the API ids and the event size are checked against this file in unit tests and
 * against the compiled program at load time). */
#ifndef FABRICSCOPE_NCCL_H
#define FABRICSCOPE_NCCL_H

#include <linux/types.h>

/* One id per probed NCCL function (symbol). Python: nccl_layout.APIS. */
#define FS_NCCL_API_ALLREDUCE 1
#define FS_NCCL_API_ALLREDUCE_CONFIG 2
#define FS_NCCL_API_REDUCESCATTER 3
#define FS_NCCL_API_REDUCESCATTER_CONFIG 4
#define FS_NCCL_API_ALLGATHER 5
#define FS_NCCL_API_ALLGATHER_CONFIG 6
#define FS_NCCL_API_ALLTOALL 7
#define FS_NCCL_API_ALLTOALL_CONFIG 8
#define FS_NCCL_API_BROADCAST 9
#define FS_NCCL_API_BROADCAST_CONFIG 10
#define FS_NCCL_API_BCAST 11
#define FS_NCCL_API_REDUCE 12
#define FS_NCCL_API_REDUCE_CONFIG 13
#define FS_NCCL_API_GATHER 14
#define FS_NCCL_API_GATHER_CONFIG 15
#define FS_NCCL_API_SCATTER 16
#define FS_NCCL_API_SCATTER_CONFIG 17
#define FS_NCCL_API_SEND 18
#define FS_NCCL_API_RECV 19
#define FS_NCCL_API_GROUP_START 20
#define FS_NCCL_API_GROUP_END 21
#define FS_NCCL_API_COMM_INIT_RANK 22
#define FS_NCCL_API_COMM_INIT_RANK_CONFIG 23
#define FS_NCCL_API_COMM_INIT_RANK_SCALABLE 24
#define FS_NCCL_API_COMM_SPLIT 25
#define FS_NCCL_API_COMM_SHRINK 26
#define FS_NCCL_API_COMM_GROW 27
#define FS_NCCL_API_COMM_DESTROY 28
#define FS_NCCL_API_COMM_ABORT 29
#define FS_NCCL_API_COMM_FINALIZE 30

/* event flags */
#define FS_NCCL_F_RETURNED 1   /* ret and ret_ts_ns are set (uretprobe fired) */
#define FS_NCCL_F_ID 2         /* id_hash holds NCCL's commHash of the unique id */
#define FS_NCCL_F_OUT 4        /* aux is the ncclComm_t* out argument; comm read from it */

/* indexes of the per-CPU `stats` array */
#define FS_NCCL_STAT_HITS 0        /* entry probe hits (all processes) */
#define FS_NCCL_STAT_EMITTED 1     /* events written to the ring buffer */
#define FS_NCCL_STAT_LOST 2        /* events lost: ring buffer full */
#define FS_NCCL_STAT_NESTED 3      /* probed calls made by a probed call (ncclBcast ->
				    * ncclBroadcast): not reported twice */
#define FS_NCCL_STAT_ORPHAN 4      /* returns without a recorded entry (entry evicted) */
#define FS_NCCL_STAT_FILTERED 5    /* calls of processes outside the pid filter */
#define FS_NCCL_STAT_ID_UNREADABLE 6 /* unique id could not be read from user memory */
#define FS_NCCL_NSTATS 7

#define FS_NCCL_NONE (-1)      /* int fields without a value for this call */

struct fs_nccl_event {
	__u64 ts_ns;       /* entry, bpf_ktime_get_ns: when the call was made */
	__u64 ret_ts_ns;   /* return; 0 without FS_NCCL_F_RETURNED */
	__u64 seq;         /* order of calls seen by this program (gaps: lost events) */
	__u64 count;       /* count argument (elements) */
	__u64 comm;        /* ncclComm_t; for init/split/shrink/grow the new comm */
	__u64 stream;      /* cudaStream_t */
	__u64 aux;         /* ncclComm_t* out argument (FS_NCCL_F_OUT) */
	__u64 parent;      /* split/shrink/grow: the parent comm */
	__u64 id_hash;     /* init: NCCL's commHash of the unique id (FS_NCCL_F_ID) */
	__u32 pid;         /* tgid */
	__u32 tid;
	__u16 api;         /* FS_NCCL_API_* */
	__u16 flags;       /* FS_NCCL_F_* */
	__s32 ret;         /* ncclResult_t */
	__s32 datatype;    /* ncclDataType_t or FS_NCCL_NONE */
	__s32 redop;       /* ncclRedOp_t or FS_NCCL_NONE */
	__s32 peer;        /* root (Broadcast/Reduce/Gather/Scatter) or peer (Send/Recv) */
	__s32 nranks;      /* init/grow: nranks argument */
	__s32 rank;        /* init/grow: rank argument */
	__s32 color;       /* split: color; shrink: excludeRanksCount; init scalable: nId */
	__s32 key;         /* split: key */
	__u32 pad;
};

/* A call between its entry and its return, per thread. */
struct fs_nccl_inflight {
	struct fs_nccl_event ev;
	__u32 depth;       /* probed calls open on this thread (nesting) */
	__u32 pad;
};

#endif
