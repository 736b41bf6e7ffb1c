/* fabricscope's own declarations of the NCCL profiler plugin ABI, versions 1 to 6.
 *
 * Written from NVIDIA/nccl src/include/plugin/profiler/profiler_v{1..6}.h and
 * net_{ib,socket}_v1.h: same member order and types, so the same layout on LP64
 * (x86_64, aarch64). The static assertions at the end pin the sizes and offsets
 * that matter (checked against NVIDIA's own headers when they were written); the
 * harness checks the same numbers from Python (tests/support/nccl_profiler_host.py).
 * Which NCCL release introduced each version: docs/nccl-profiler.md.
 */
#ifndef FS_NCCL_ABI_H
#define FS_NCCL_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef int fsp_result_t;               /* ncclResult_t: 0 is ncclSuccess */
#define FSP_SUCCESS 0
#define FSP_INTERNAL_ERROR 3

typedef void (*fsp_logger_t)(int level, unsigned long flags, const char *file, int line,
                             const char *fmt, ...);

enum fsp_event_type {                   /* the ncclProfile* event type bits */
  FSP_GROUP = 1 << 0, FSP_COLL = 1 << 1, FSP_P2P = 1 << 2, FSP_PROXY_OP = 1 << 3,
  FSP_PROXY_STEP = 1 << 4, FSP_PROXY_CTRL = 1 << 5, FSP_KERNEL_CH = 1 << 6,
  FSP_NET_PLUGIN = 1 << 7, FSP_GROUP_API = 1 << 8, FSP_COLL_API = 1 << 9,
  FSP_P2P_API = 1 << 10, FSP_KERNEL_LAUNCH = 1 << 11, FSP_CE_COLL = 1 << 12,
  FSP_CE_SYNC = 1 << 13, FSP_CE_BATCH = 1 << 14,
};

enum fsp_state {                        /* ncclProfilerEventState_t */
  FSP_OP_SEND_POSTED = 0, FSP_OP_SEND_REM_FIFO_WAIT = 1, FSP_OP_SEND_TRANSMITTED = 2,
  FSP_OP_SEND_DONE = 3, FSP_OP_RECV_POSTED = 4, FSP_OP_RECV_RECEIVED = 5,
  FSP_OP_RECV_TRANSMITTED = 6, FSP_OP_RECV_DONE = 7, FSP_OP_IN_PROGRESS_V4 = 19,
  FSP_STEP_SEND_GPU_WAIT = 8, FSP_STEP_SEND_PEER_WAIT_V4 = 20, FSP_STEP_SEND_WAIT = 9,
  FSP_STEP_RECV_WAIT = 10, FSP_STEP_RECV_FLUSH_WAIT = 11, FSP_STEP_RECV_GPU_WAIT = 12,
  FSP_CTRL_IDLE = 13, FSP_CTRL_ACTIVE = 14, FSP_CTRL_SLEEP = 15, FSP_CTRL_WAKEUP = 16,
  FSP_CTRL_APPEND = 17, FSP_CTRL_APPEND_END = 18, FSP_NET_PLUGIN_UPDATE = 21,
  FSP_KERNEL_CH_STOP = 22, FSP_GROUP_START_API_STOP = 23, FSP_GROUP_END_API_START = 24,
  FSP_LAST_STATE = 30,           /* 25..30: copy-engine states (v6) */
};

/* ---- v1 (NCCL 2.23): enum codes instead of strings ---- */
typedef struct {
  uint8_t type; void *parentObj; int rank;
  union {
    struct {
      const char *name; uint64_t commHash; uint64_t seqNumber; uint8_t func;
      const void *sendBuff; void *recvBuff; size_t count; int root; uint8_t datatype;
      uint32_t op; size_t trafficBytes; uint8_t nMaxChannels; uint8_t nWarps;
      uint8_t algo; uint8_t proto; int isCollnet; int isNvls;
    } coll;
    struct {
      const char *name; uint64_t commHash; uint8_t func; void *buff; uint8_t datatype;
      size_t count; int peer;
    } p2p;
    struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
    struct { int step; } proxyStep;
  };
} fsp_descr_v1_t;

/* ---- v2 (NCCL 2.24): strings, trafficBytes kept ---- */
typedef struct {
  uint8_t type; void *parentObj; int rank;
  union {
    struct {
      const char *name; uint64_t commHash; uint64_t seqNumber; const char *func;
      const void *sendBuff; void *recvBuff; size_t count; int root; const char *datatype;
      size_t trafficBytes; uint8_t nMaxChannels; uint8_t nWarps; const char *algo;
      const char *proto;
    } coll;
    struct {
      const char *name; uint64_t commHash; const char *func; void *buff;
      const char *datatype; size_t count; int peer;
    } p2p;
    struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
    struct { int step; } proxyStep;
  };
} fsp_descr_v2_t;

/* v1..v3 state arguments */
typedef union {
  struct { size_t transSize; int steps; } proxyOp;
  struct { int appendedProxyOps; } proxyCtrl;
} fsp_state_args_v1_t;

/* ---- v3 (NCCL 2.26): KernelCh and NetPlugin events ---- */
typedef struct {
  uint8_t type; void *parentObj; int rank;
  union {
    struct {
      const char *name; uint64_t commHash; uint64_t seqNumber; const char *func;
      const void *sendBuff; void *recvBuff; size_t count; int root; const char *datatype;
      uint8_t nMaxChannels; uint8_t nWarps; const char *algo; const char *proto;
    } coll;
    struct {
      const char *name; uint64_t commHash; const char *func; void *buff;
      const char *datatype; size_t count; int peer;
    } p2p;
    struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
    struct { int step; } proxyStep;
    struct { uint8_t channelId; } kernelCh;
    struct { int64_t id; void *data; } netPlugin;
  };
} fsp_descr_v3_t;

/* ---- v4 (NCCL 2.27): comm identity moves to init, GPU ptimer on KernelCh ---- */
typedef struct {
  uint8_t type; void *parentObj; int rank;
  union {
    struct {
      uint64_t seqNumber; const char *func; const void *sendBuff; void *recvBuff;
      size_t count; int root; const char *datatype; uint8_t nChannels; uint8_t nWarps;
      const char *algo; const char *proto;
    } coll;
    struct {
      const char *func; void *buff; const char *datatype; size_t count; int peer;
      uint8_t nChannels;
    } p2p;
    struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
    struct { int step; } proxyStep;
    struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
    struct { int64_t id; void *data; } netPlugin;
  };
} fsp_descr_v4_t;

/* v4..v6 state arguments */
typedef union {
  struct { size_t transSize; } proxyStep;
  struct { int appendedProxyOps; } proxyCtrl;
  struct { void *data; } netPlugin;
  struct { uint64_t pTimer; } kernelCh;
} fsp_state_args_v4_t;

/* the v4 coll/p2p plus API events; v5 and v6 share this prefix */
#define FSP_DESCR_V5_MEMBERS                                                              \
  struct { bool graphCaptured; int groupDepth; } groupApi;                               \
  struct {                                                                                \
    const char *func; size_t count; const char *datatype; int root; void *stream;         \
    bool graphCaptured;                                                                   \
  } collApi;                                                                              \
  struct {                                                                                \
    const char *func; size_t count; const char *datatype; void *stream; bool graphCaptured; \
  } p2pApi;                                                                               \
  struct { void *stream; } kernelLaunch;                                                  \
  struct {                                                                                \
    uint64_t seqNumber; const char *func; const void *sendBuff; void *recvBuff;           \
    size_t count; int root; const char *datatype; uint8_t nChannels; uint8_t nWarps;      \
    const char *algo; const char *proto; void *parentGroup;                               \
  } coll;                                                                                 \
  struct {                                                                                \
    const char *func; void *buff; const char *datatype; size_t count; int peer;           \
    uint8_t nChannels; void *parentGroup;                                                 \
  } p2p;                                                                                  \
  struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp; \
  struct { int step; } proxyStep;                                                         \
  struct { uint8_t channelId; uint64_t pTimer; } kernelCh;                                \
  struct { int64_t id; void *data; } netPlugin;

/* ---- v5 (NCCL 2.28): 64-bit type, API events, commId first at init ---- */
typedef struct {
  uint64_t type; void *parentObj; int rank;
  union { FSP_DESCR_V5_MEMBERS };
} fsp_descr_v5_t;

/* ---- v6 (NCCL 2.29.2): copy-engine collectives ---- */
typedef struct {
  uint64_t type; void *parentObj; int rank;
  union {
    FSP_DESCR_V5_MEMBERS
    struct {
      uint64_t seqNumber; const char *func; const void *sendBuff; void *recvBuff;
      size_t count; int root; const char *datatype; const char *syncStrategy;
      bool intraBatchSync; uint32_t batchSize; uint32_t numBatches; uint32_t ceSeqNum;
      void *stream;
    } ceColl;
    struct { bool isComplete; int nRanks; } ceCollSync;
    struct { int numOps; size_t totalBytes; bool useIntraSync; } ceCollBatch;
  };
} fsp_descr_v6_t;

/* the plugin structs NCCL dlsyms ("ncclProfiler_v6", then v5, ... v1) */
typedef fsp_result_t (*fsp_stop_fn)(void *eHandle);
typedef fsp_result_t (*fsp_finalize_fn)(void *context);
typedef fsp_result_t (*fsp_init_v1_fn)(void **context, int *eActivationMask);
typedef fsp_result_t (*fsp_init_v4_fn)(void **context, int *eActivationMask, const char *commName,
                                       uint64_t commHash, int nNodes, int nranks, int rank,
                                       fsp_logger_t logfn);
typedef fsp_result_t (*fsp_init_v5_fn)(void **context, uint64_t commId, int *eActivationMask,
                                       const char *commName, int nNodes, int nranks, int rank,
                                       fsp_logger_t logfn);

#define FSP_PLUGIN_STRUCT(v, init_t, args_t)                                               \
  typedef struct {                                                                         \
    const char *name;                                                                      \
    init_t init;                                                                           \
    fsp_result_t (*startEvent)(void *context, void **eHandle, fsp_descr_##v##_t *eDescr);  \
    fsp_stop_fn stopEvent;                                                                 \
    fsp_result_t (*recordEventState)(void *eHandle, int eState, args_t *eStateArgs);       \
    fsp_finalize_fn finalize;                                                              \
  } fsp_profiler_##v##_t;

FSP_PLUGIN_STRUCT(v1, fsp_init_v1_fn, fsp_state_args_v1_t)
FSP_PLUGIN_STRUCT(v2, fsp_init_v1_fn, fsp_state_args_v1_t)
FSP_PLUGIN_STRUCT(v3, fsp_init_v1_fn, fsp_state_args_v1_t)
FSP_PLUGIN_STRUCT(v4, fsp_init_v4_fn, fsp_state_args_v4_t)
FSP_PLUGIN_STRUCT(v5, fsp_init_v5_fn, fsp_state_args_v4_t)
FSP_PLUGIN_STRUCT(v6, fsp_init_v5_fn, fsp_state_args_v4_t)

/* network plugin events (NetPlugin descriptor: id = type | version, data = one of these) */
#define FSP_NET_VER_MASK 0xffffu
#define FSP_NET_TYPE_MASK 0xffff0000u
#define FSP_NET_TYPE_IB (1u << 16)
#define FSP_NET_TYPE_SOCK (2u << 16)
#define FSP_NET_IB_QP 1
#define FSP_NET_SOCK_EVENT 1

typedef struct {
  uint8_t type;
  union { struct { int device; uint64_t wr_id; int opcode; int qpNum; size_t length; } qp; };
} fsp_net_ib_descr_v1_t;

typedef struct {
  uint8_t type;
  union { struct { int fd; int op; size_t length; } sock; };
} fsp_net_sock_descr_v1_t;

/* Layout pins for LP64; the same numbers are asserted from Python. */
#if defined(__LP64__)
#define FSP_PIN(t, m, off) _Static_assert(offsetof(t, m) == (off), #t "." #m)
_Static_assert(sizeof(fsp_descr_v1_t) == 120, "v1 descr size");
FSP_PIN(fsp_descr_v1_t, coll.trafficBytes, 96);
FSP_PIN(fsp_descr_v1_t, coll.algo, 106);
_Static_assert(sizeof(fsp_descr_v2_t) == 128, "v2 descr size");
FSP_PIN(fsp_descr_v2_t, coll.algo, 112);
_Static_assert(sizeof(fsp_descr_v3_t) == 120, "v3 descr size");
FSP_PIN(fsp_descr_v3_t, coll.proto, 112);
FSP_PIN(fsp_descr_v3_t, netPlugin.data, 32);
_Static_assert(sizeof(fsp_descr_v4_t) == 104, "v4 descr size");
FSP_PIN(fsp_descr_v4_t, coll.nChannels, 80);
FSP_PIN(fsp_descr_v4_t, kernelCh.pTimer, 32);
FSP_PIN(fsp_descr_v4_t, proxyOp.isSend, 44);
_Static_assert(sizeof(fsp_descr_v5_t) == 112, "v5 descr size");
FSP_PIN(fsp_descr_v5_t, coll.parentGroup, 104);
FSP_PIN(fsp_descr_v5_t, p2p.parentGroup, 64);
FSP_PIN(fsp_descr_v5_t, collApi.graphCaptured, 64);
_Static_assert(sizeof(fsp_descr_v6_t) == 112, "v6 descr size");
FSP_PIN(fsp_descr_v6_t, ceColl.stream, 104);
_Static_assert(sizeof(fsp_state_args_v1_t) == 16, "v1 args size");
_Static_assert(sizeof(fsp_state_args_v4_t) == 8, "v4 args size");
_Static_assert(sizeof(fsp_net_ib_descr_v1_t) == 40, "ib descr size");
FSP_PIN(fsp_net_ib_descr_v1_t, qp.length, 32);
_Static_assert(sizeof(fsp_net_sock_descr_v1_t) == 24, "sock descr size");
_Static_assert(sizeof(fsp_profiler_v5_t) == 48, "plugin struct size");
#endif

#endif /* FS_NCCL_ABI_H */
