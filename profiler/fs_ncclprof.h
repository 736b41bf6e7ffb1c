/* fabricscope NCCL profiler plugin: the shared-memory ring (read by
 * agent/probes/ncclprof/) and the plugin's internal interfaces.
 *
 * One ring per process: FABRICSCOPE_NCCLPROF_DIR (default /dev/shm) /
 * fabricscope-ncclprof-<pid>.ring, a header and `capacity` fixed-size records.
 * Producers (any NCCL thread that completes an aggregate) reserve an index by CAS
 * on write_index, never past read_index + capacity (a full ring drops the newest
 * record and counts it), copy the record, then publish it by storing commit =
 * index + 1 last (release). A producer that dies between reserve and publish
 * leaves a record whose commit is stale: the reader skips it and counts it torn.
 */
#ifndef FS_NCCLPROF_H
#define FS_NCCLPROF_H

#include <stdint.h>
#include "fs_nccl_abi.h"

#define FSP_RING_MAGIC 0x464f5250434e5346ull     /* "FSNCPROF" little-endian */
#define FSP_RING_VERSION 1
#define FSP_HEADER_SIZE 512
#define FSP_NWAITS 6
#define FSP_NCOUNTERS 16

enum fsp_record_kind { FSP_REC_COLL = 1, FSP_REC_P2P = 2, FSP_REC_PROXY = 3 };

enum fsp_record_flag {
  FSP_F_GPU_TIMER = 1 << 0,    /* gpu_start/gpu_stop are GPU globaltimer ns (KernelCh pTimer) */
  FSP_F_KERNEL_HOST = 1 << 1,  /* gpu_start/gpu_stop are host times the proxy saw the kernel */
  FSP_F_INCOMPLETE = 1 << 2,   /* closed by the stale sweep or at finalize, not by its stops */
  FSP_F_ORPHAN = 1 << 3,       /* proxy op whose collective was already gone or foreign */
  FSP_F_SEND = 1 << 4,         /* proxy op sends (else receives) */
};

/* Time a proxy step spent in each state, from entering it to the next state or stop. */
enum fsp_wait { FSP_W_SEND_GPU, FSP_W_SEND_PEER, FSP_W_SEND_NET, FSP_W_RECV_NET,
                FSP_W_RECV_FLUSH, FSP_W_RECV_GPU };

/* Closed vocabularies written as one byte; 0 is "unknown" in each. */
#define FSP_FUNCS "Unknown", "Broadcast", "Reduce", "AllGather", "ReduceScatter", \
  "AllReduce", "SendRecv", "Send", "Recv", "AlltoAll", "Gather", "Scatter"
#define FSP_ALGOS "Unknown", "TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", \
  "NVLS_TREE", "PAT"
#define FSP_PROTOS "Unknown", "LL", "LL128", "SIMPLE"
#define FSP_DTYPES "Unknown", "ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", \
  "ncclUint64", "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16", \
  "ncclFloat8e4m3", "ncclFloat8e5m2"
#define FSP_DTYPE_SIZES 0, 1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1

enum fsp_counter {
  FSP_C_EVENTS, FSP_C_POOL_EXHAUSTED, FSP_C_RING_FULL, FSP_C_ORPHANS, FSP_C_BAD_HANDLE,
  FSP_C_STALE_RECLAIMED, FSP_C_UNFINISHED_AT_FINALIZE, FSP_C_IGNORED, FSP_C_RECORDS,
  FSP_C_CONTEXTS, FSP_C_UNKNOWN_STATE, FSP_C_NET_UNKNOWN, FSP_C_CONTEXTS_EXHAUSTED,
};

struct fsp_record {               /* 192 bytes, little-endian, offsets in comments */
  uint64_t commit;                /*   0 write index + 1 once published */
  uint16_t kind;                  /*   8 enum fsp_record_kind */
  uint8_t func, algo, proto, dtype; /* 10 codes in FSP_FUNCS ... FSP_DTYPES */
  uint8_t flags;                  /*  14 enum fsp_record_flag */
  uint8_t nchannels;              /*  15 collective: channels NCCL chose */
  uint64_t comm_hash;             /*  16 communicator hash (commHash / commId) */
  uint64_t seq;                   /*  24 collective sequence number per function */
  int32_t rank;                   /*  32 */
  int32_t peer;                   /*  36 root (coll), peer (p2p, proxy op) */
  uint64_t count;                 /*  40 elements (coll, p2p) */
  uint64_t bytes;                 /*  48 count x element size (coll, p2p); moved (proxy op) */
  uint64_t start_ns;              /*  56 host CLOCK_MONOTONIC */
  uint64_t stop_ns;               /*  64 host: coll/p2p enqueue done, proxy op done */
  uint64_t gpu_start;             /*  72 earliest kernel channel start (see flags) */
  uint64_t gpu_stop;              /*  80 latest kernel channel stop */
  uint64_t wait_ns[FSP_NWAITS];   /*  88 enum fsp_wait sums over the proxy steps */
  uint64_t sent_bytes;            /* 136 proxy step bytes sent over the network */
  uint64_t recv_bytes;            /* 144 proxy step bytes received */
  uint64_t net_ns;                /* 152 NetPlugin events: summed durations */
  uint64_t net_bytes;             /* 160 NetPlugin events: summed lengths */
  uint32_t net_events;            /* 168 NetPlugin events folded in */
  uint32_t net_qp;                /* 172 first IB QP number (or socket fd) seen */
  uint32_t proxy_ops;             /* 176 proxy ops folded in (coll) */
  uint32_t steps;                 /* 180 proxy steps folded in */
  uint16_t kernel_chs;            /* 184 kernel channel events folded in */
  uint8_t channel;                /* 186 proxy op channel */
  uint8_t nwarps;                 /* 187 */
  int32_t nsteps;                 /* 188 proxy op: steps NCCL planned */
};

struct fsp_ring_header {
  uint64_t magic;                 /*   0 */
  uint32_t version;               /*   8 */
  uint32_t header_size;           /*  12 */
  uint32_t record_size;           /*  16 */
  uint32_t capacity;              /*  20 records, a power of two */
  uint32_t pid;                   /*  24 */
  uint32_t closed;                /*  28 1 after the last communicator's finalize */
  uint64_t mono_ns_at_open;       /*  32 CLOCK_MONOTONIC and */
  uint64_t real_ns_at_open;       /*  40 CLOCK_REALTIME read together at open */
  uint8_t pad0[16];
  uint64_t write_index;           /*  64 records reserved (producers) */
  uint8_t pad1[56];
  uint64_t read_index;            /* 128 records consumed (the reader writes it) */
  uint8_t pad2[56];
  uint64_t counters[FSP_NCOUNTERS]; /* 192 enum fsp_counter */
  uint8_t pad3[FSP_HEADER_SIZE - 192 - 8 * FSP_NCOUNTERS];
};

_Static_assert(sizeof(struct fsp_record) == 192, "record size");
_Static_assert(sizeof(struct fsp_ring_header) == FSP_HEADER_SIZE, "header size");

/* ring.c */
int fsp_ring_open(fsp_logger_t log);            /* idempotent; 0 on success */
void fsp_ring_close(void);                       /* marks the ring closed */
void fsp_ring_write(struct fsp_record *rec);     /* lock-free; counts a full ring */
void fsp_count(enum fsp_counter c, uint64_t n);
uint64_t fsp_now_ns(void);

/* events.c: one event as every ABI version describes it */
struct fsp_event {
  int type;                       /* enum fsp_event_type */
  void *parent;
  int rank;
  uint64_t comm_hash, seq, count, ptimer;
  const char *func, *dtype, *algo, *proto;  /* strings (v2+) */
  int func_code, dtype_code, algo_code, proto_code;  /* v1 enum codes, -1 when strings */
  int root_or_peer, nchannels, nwarps;
  pid_t pid;
  int channel, nsteps, chunk_size, is_send, step;
  int64_t net_id;
  void *net_data;
};

struct fsp_ctx;
fsp_result_t fsp_init(void **context, int *mask, int version, const char *name, uint64_t comm_hash,
                      int nnodes, int nranks, int rank, fsp_logger_t log);
fsp_result_t fsp_start(void *context, void **handle, const struct fsp_event *ev);
fsp_result_t fsp_stop(void *handle);
fsp_result_t fsp_state(void *handle, int state, uint64_t size_or_ptimer, int has_arg);
fsp_result_t fsp_finalize(void *context);

/* pool.c */
#define FSP_NIL 0xffffffffu
struct fsp_slot;
int fsp_pool_init(void);                          /* idempotent; 0 on success */
uint32_t fsp_pool_alloc(uint32_t refs, uint32_t *gen);   /* FSP_NIL when exhausted */
struct fsp_slot *fsp_slot_at(uint32_t idx);
void *fsp_handle(uint32_t idx, uint32_t gen);
int fsp_handle_decode(const void *h, uint32_t *idx, uint32_t *gen);
int fsp_acquire(uint32_t idx, uint32_t gen);      /* 1 when a reference was taken */
int fsp_release(uint32_t idx, uint32_t gen);      /* 1 when it finished the event */
int fsp_is_live(uint32_t idx, uint32_t gen);
void fsp_pool_free(uint32_t idx);
uint32_t fsp_pool_size(void);
uint32_t fsp_pool_in_use(void);
/* Forces every live event started before `born_before_ns` (all when 0) of `ctx` (any when NULL)
 * to finish; returns how many. */
uint32_t fsp_pool_sweep(uint64_t born_before_ns, const struct fsp_ctx *ctx);
void fsp_finish(uint32_t idx, int forced);       /* events.c: fold, emit, release parent, free */

#endif
