/* The exported plugin structs, ncclProfiler_v1 .. ncclProfiler_v6: each version's
 * descriptor and state arguments are read into one struct fsp_event. NCCL dlsyms the
 * newest it knows (v6 first) and uses only that one. */
#include <string.h>
#include "fs_ncclprof.h"

#define EXPORT __attribute__((visibility("default")))
#define PLUGIN_NAME "fabricscope"

static void common(struct fsp_event *e, int type, void *parent, int rank) {
  memset(e, 0, sizeof(*e));
  e->type = type;
  e->parent = parent;
  e->rank = rank;
  e->func_code = e->dtype_code = e->algo_code = e->proto_code = -1;
}

#define COPY_STRINGS(e, d)                                                          \
  do {                                                                              \
    (e).func = (d).func; (e).dtype = (d).datatype; (e).algo = (d).algo; (e).proto = (d).proto; \
  } while (0)
#define COPY_PROXY(e, d)                                                            \
  do {                                                                              \
    (e).pid = (d).pid; (e).channel = (d).channelId; (e).root_or_peer = (d).peer;    \
    (e).nsteps = (d).nSteps; (e).chunk_size = (d).chunkSize; (e).is_send = (d).isSend; \
  } while (0)

/* ---- v1: enum codes ---- */
static fsp_result_t start_v1(void *ctx, void **h, fsp_descr_v1_t *d) {
  struct fsp_event e;
  common(&e, d->type, d->parentObj, d->rank);
  if (d->type == FSP_COLL) {
    e.comm_hash = d->coll.commHash; e.seq = d->coll.seqNumber; e.count = d->coll.count;
    e.func_code = d->coll.func; e.dtype_code = d->coll.datatype;
    e.algo_code = d->coll.algo; e.proto_code = d->coll.proto;
    e.root_or_peer = d->coll.root; e.nchannels = d->coll.nMaxChannels; e.nwarps = d->coll.nWarps;
  } else if (d->type == FSP_P2P) {
    e.comm_hash = d->p2p.commHash; e.count = d->p2p.count; e.func_code = d->p2p.func;
    e.dtype_code = d->p2p.datatype; e.root_or_peer = d->p2p.peer;
  } else if (d->type == FSP_PROXY_OP) {
    COPY_PROXY(e, d->proxyOp);
  } else if (d->type == FSP_PROXY_STEP) {
    e.step = d->proxyStep.step;
  }
  return fsp_start(ctx, h, &e);
}

/* v2 and v3 share the coll/p2p/proxy part; v3 adds KernelCh and NetPlugin */
#define START_V2_V3(d, e)                                                             \
  if ((d)->type == FSP_COLL) {                                                        \
    (e).comm_hash = (d)->coll.commHash; (e).seq = (d)->coll.seqNumber;                \
    (e).count = (d)->coll.count; COPY_STRINGS(e, (d)->coll);                          \
    (e).root_or_peer = (d)->coll.root; (e).nchannels = (d)->coll.nMaxChannels;        \
    (e).nwarps = (d)->coll.nWarps;                                                    \
  } else if ((d)->type == FSP_P2P) {                                                  \
    (e).comm_hash = (d)->p2p.commHash; (e).count = (d)->p2p.count;                    \
    (e).func = (d)->p2p.func; (e).dtype = (d)->p2p.datatype;                          \
    (e).root_or_peer = (d)->p2p.peer;                                                 \
  } else if ((d)->type == FSP_PROXY_OP) {                                             \
    COPY_PROXY(e, (d)->proxyOp);                                                      \
  } else if ((d)->type == FSP_PROXY_STEP) {                                           \
    (e).step = (d)->proxyStep.step;                                                   \
  }

static fsp_result_t start_v2(void *ctx, void **h, fsp_descr_v2_t *d) {
  struct fsp_event e;
  common(&e, d->type, d->parentObj, d->rank);
  START_V2_V3(d, e)
  return fsp_start(ctx, h, &e);
}

static fsp_result_t start_v3(void *ctx, void **h, fsp_descr_v3_t *d) {
  struct fsp_event e;
  common(&e, d->type, d->parentObj, d->rank);
  START_V2_V3(d, e)
  else if (d->type == FSP_KERNEL_CH) e.channel = d->kernelCh.channelId;
  else if (d->type == FSP_NET_PLUGIN) { e.net_id = d->netPlugin.id; e.net_data = d->netPlugin.data; }
  return fsp_start(ctx, h, &e);
}

/* v4, v5 and v6 name the same members; v5+ add API events (ignored) and parentGroup */
#define START_V4_ON(d, e)                                                             \
  if ((d)->type == FSP_COLL) {                                                        \
    (e).seq = (d)->coll.seqNumber; (e).count = (d)->coll.count;                       \
    COPY_STRINGS(e, (d)->coll); (e).root_or_peer = (d)->coll.root;                    \
    (e).nchannels = (d)->coll.nChannels; (e).nwarps = (d)->coll.nWarps;               \
  } else if ((d)->type == FSP_P2P) {                                                  \
    (e).count = (d)->p2p.count; (e).func = (d)->p2p.func;                             \
    (e).dtype = (d)->p2p.datatype; (e).root_or_peer = (d)->p2p.peer;                  \
    (e).nchannels = (d)->p2p.nChannels;                                               \
  } else if ((d)->type == FSP_PROXY_OP) {                                             \
    COPY_PROXY(e, (d)->proxyOp);                                                      \
  } else if ((d)->type == FSP_PROXY_STEP) {                                           \
    (e).step = (d)->proxyStep.step;                                                   \
  } else if ((d)->type == FSP_KERNEL_CH) {                                            \
    (e).channel = (d)->kernelCh.channelId; (e).ptimer = (d)->kernelCh.pTimer;         \
  } else if ((d)->type == FSP_NET_PLUGIN) {                                           \
    (e).net_id = (d)->netPlugin.id; (e).net_data = (d)->netPlugin.data;               \
  }

static fsp_result_t start_v4(void *ctx, void **h, fsp_descr_v4_t *d) {
  struct fsp_event e;
  common(&e, d->type, d->parentObj, d->rank);
  START_V4_ON(d, e)
  return fsp_start(ctx, h, &e);
}

/* From v5 on, a Coll's parentObj is its CollApi event; the Group is coll.parentGroup.
 * Neither is aggregated, so the parent stays whatever NCCL passed. */
static fsp_result_t start_v5(void *ctx, void **h, fsp_descr_v5_t *d) {
  struct fsp_event e;
  common(&e, (int)d->type, d->parentObj, d->rank);
  START_V4_ON(d, e)
  return fsp_start(ctx, h, &e);
}

static fsp_result_t start_v6(void *ctx, void **h, fsp_descr_v6_t *d) {
  struct fsp_event e;
  common(&e, (int)d->type, d->parentObj, d->rank);
  START_V4_ON(d, e)
  return fsp_start(ctx, h, &e);
}

/* v1-v3: transSize travels with the (deprecated) proxy op states only */
static fsp_result_t state_v1(void *h, int s, fsp_state_args_v1_t *a) {
  int op_state = s >= FSP_OP_SEND_POSTED && s <= FSP_OP_RECV_DONE;
  return fsp_state(h, s, a && op_state ? a->proxyOp.transSize : 0, a && op_state);
}

static fsp_result_t state_v4(void *h, int s, fsp_state_args_v4_t *a) {
  int has = a != NULL && (s == FSP_KERNEL_CH_STOP || (s >= FSP_STEP_SEND_GPU_WAIT &&
                                                      s <= FSP_STEP_RECV_GPU_WAIT) ||
                          s == FSP_STEP_SEND_PEER_WAIT_V4);
  if (!has) return fsp_state(h, s, 0, 0);
  return fsp_state(h, s, s == FSP_KERNEL_CH_STOP ? a->kernelCh.pTimer : a->proxyStep.transSize, 1);
}

static fsp_result_t init_v1(void **ctx, int *mask) {
  return fsp_init(ctx, mask, 1, NULL, 0, 0, 0, 0, NULL);
}
static fsp_result_t init_v2(void **ctx, int *mask) {
  return fsp_init(ctx, mask, 2, NULL, 0, 0, 0, 0, NULL);
}
static fsp_result_t init_v3(void **ctx, int *mask) {
  return fsp_init(ctx, mask, 3, NULL, 0, 0, 0, 0, NULL);
}
static fsp_result_t init_v4(void **ctx, int *mask, const char *name, uint64_t hash, int nnodes,
                            int nranks, int rank, fsp_logger_t log) {
  return fsp_init(ctx, mask, 4, name, hash, nnodes, nranks, rank, log);
}
static fsp_result_t init_v5(void **ctx, uint64_t id, int *mask, const char *name, int nnodes,
                            int nranks, int rank, fsp_logger_t log) {
  return fsp_init(ctx, mask, 5, name, id, nnodes, nranks, rank, log);
}
static fsp_result_t init_v6(void **ctx, uint64_t id, int *mask, const char *name, int nnodes,
                            int nranks, int rank, fsp_logger_t log) {
  return fsp_init(ctx, mask, 6, name, id, nnodes, nranks, rank, log);
}

EXPORT const fsp_profiler_v1_t ncclProfiler_v1 = {PLUGIN_NAME, init_v1, start_v1, fsp_stop, state_v1, fsp_finalize};
EXPORT const fsp_profiler_v2_t ncclProfiler_v2 = {PLUGIN_NAME, init_v2, start_v2, fsp_stop, state_v1, fsp_finalize};
EXPORT const fsp_profiler_v3_t ncclProfiler_v3 = {PLUGIN_NAME, init_v3, start_v3, fsp_stop, state_v1, fsp_finalize};
EXPORT const fsp_profiler_v4_t ncclProfiler_v4 = {PLUGIN_NAME, init_v4, start_v4, fsp_stop, state_v4, fsp_finalize};
EXPORT const fsp_profiler_v5_t ncclProfiler_v5 = {PLUGIN_NAME, init_v5, start_v5, fsp_stop, state_v4, fsp_finalize};
EXPORT const fsp_profiler_v6_t ncclProfiler_v6 = {PLUGIN_NAME, init_v6, start_v6, fsp_stop, state_v4, fsp_finalize};

/* Objects the pool holds now: the harness and the agent's tests check it returns to 0. */
EXPORT uint32_t fabricscope_ncclprof_pool_in_use(void) { return fsp_pool_in_use(); }
