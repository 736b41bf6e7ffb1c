/* Aggregation: each NCCL event becomes a pooled object holding a reference on its parent;
 * when an object's last reference goes (its own stop, its children's finishes) it folds
 * its sums into the parent and, for collectives, p2p tasks and proxy ops, publishes a record.
 *
 * NCCL stops a Coll event right after enqueueing it, usually before its proxy ops and
 * kernel channels start on the proxy thread; so a collective started with KernelCh
 * events active keeps one reference per channel ("holds") for the kernel channel events
 * to come, and stays open until they finish. Without KernelCh, proxy ops that start after
 * their collective was published are reported alone (FSP_F_ORPHAN) and counted.
 * Nothing here blocks or does I/O: CAS loops, atomic adds and memcpy into the ring.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "fs_slot.h"

#define SWEEP_INTERVAL_NS 100000000ull

static struct fsp_ctx contexts[FSP_MAX_CTX];
pid_t fsp_self_pid;
uint64_t fsp_stale_ns = 10000000000ull;   /* FABRICSCOPE_NCCLPROF_STALE_MS */
static uint64_t last_sweep_ns;

static const char *const func_names[] = {FSP_FUNCS};
static const char *const algo_names[] = {FSP_ALGOS};
static const char *const proto_names[] = {FSP_PROTOS};
static const char *const dtype_names[] = {FSP_DTYPES};
static const uint8_t dtype_sizes[] = {FSP_DTYPE_SIZES};
#define LEN(a) (int)(sizeof(a) / sizeof((a)[0]))

struct fsp_ctx *fsp_ctx_at(int index) { return &contexts[index]; }

static uint8_t code_of(const char *s, const char *const *names, int n) {
  if (s == NULL) return 0;
  for (int i = 1; i < n; i++)
    if (strcmp(s, names[i]) == 0) return (uint8_t)i;
  return 0;
}

/* v1 passes NCCL 2.23's enum values: ncclFunc_t, ncclDataType_t, NCCL_ALGO_*, NCCL_PROTO_* */
static uint8_t v1_code(int value, int n) { return value >= 0 && value + 1 < n ? value + 1 : 0; }
static const uint8_t v1_funcs[] = {1, 2, 3, 4, 5, 6, 7, 8};

static void describe_task(struct fsp_record *r, const struct fsp_event *ev) {
  if (ev->func_code >= 0) {
    r->func = ev->func_code < LEN(v1_funcs) ? v1_funcs[ev->func_code] : 0;
    r->dtype = v1_code(ev->dtype_code, LEN(dtype_names));
    r->algo = v1_code(ev->algo_code, LEN(algo_names));
    r->proto = v1_code(ev->proto_code, LEN(proto_names));
  } else {
    r->func = code_of(ev->func, func_names, LEN(func_names));
    r->dtype = code_of(ev->dtype, dtype_names, LEN(dtype_names));
    r->algo = code_of(ev->algo, algo_names, LEN(algo_names));
    r->proto = code_of(ev->proto, proto_names, LEN(proto_names));
  }
  r->count = ev->count;
  r->bytes = ev->count * dtype_sizes[r->dtype];
  r->seq = ev->seq;
  r->rank = ev->rank;
  r->peer = ev->root_or_peer;
  r->nchannels = (uint8_t)ev->nchannels;
  r->nwarps = (uint8_t)ev->nwarps;
}

static void maybe_sweep(void) {
  uint64_t now = fsp_now_ns();
  uint64_t last = __atomic_load_n(&last_sweep_ns, __ATOMIC_RELAXED);
  if (now - last < SWEEP_INTERVAL_NS) return;
  if (!__atomic_compare_exchange_n(&last_sweep_ns, &last, now, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_RELAXED))
    return;  /* another thread sweeps */
  uint32_t n = fsp_pool_sweep(now > fsp_stale_ns ? now - fsp_stale_ns : 1, NULL);
  fsp_count(FSP_C_STALE_RECLAIMED, n);
}

static uint32_t new_slot(struct fsp_ctx *ctx, int type, uint32_t refs, uint32_t *gen) {
  uint32_t idx = fsp_pool_alloc(refs, gen);
  if (idx == FSP_NIL) {
    maybe_sweep();
    idx = fsp_pool_alloc(refs, gen);
  }
  if (idx == FSP_NIL) {
    fsp_count(FSP_C_POOL_EXHAUSTED, 1);
    return FSP_NIL;
  }
  struct fsp_slot *s = fsp_slot_at(idx);
  s->type = type;
  s->ctx = (uint16_t)ctx->index;
  s->born_ns = fsp_now_ns();
  s->rec.start_ns = s->born_ns;
  s->rec.comm_hash = ctx->comm_hash;
  return idx;
}

/* Takes a reference on the parent named by `handle` if it is live and of an expected type. */
static int attach(struct fsp_slot *child, void *handle, int parent_types) {
  uint32_t idx, gen;
  if (!fsp_handle_decode(handle, &idx, &gen)) return 0;
  struct fsp_slot *p = fsp_slot_at(idx);
  if (!(p->type & parent_types)) return 0;
  if (child->type == FSP_KERNEL_CH) {    /* spend a hold the collective kept for it */
    int32_t h = __atomic_load_n(&p->holds, __ATOMIC_ACQUIRE);
    while (h > 0 && fsp_is_live(idx, gen)) {
      if (__atomic_compare_exchange_n(&p->holds, &h, h - 1, 1, __ATOMIC_ACQ_REL,
                                      __ATOMIC_ACQUIRE))
        goto attached;
    }
  }
  if (!fsp_acquire(idx, gen)) return 0;
attached:
  if (!(p->type & parent_types) || p->ctx != child->ctx) {
    fsp_release(idx, gen);
    return 0;
  }
  child->parent = idx;
  child->parent_gen = gen;
  return 1;
}

/* A proxy op whose collective was already published still names it, when the object
 * that held the collective has not published another one since. */
static void recall_identity(struct fsp_record *r, void *handle) {
  uint32_t idx, gen;
  if (!fsp_handle_decode(handle, &idx, &gen)) return;
  struct fsp_slot *p = fsp_slot_at(idx);
  if (__atomic_load_n(&p->ident_gen, __ATOMIC_ACQUIRE) != gen) return;
  uint8_t func = p->ident_func;
  uint64_t seq = p->ident_seq, hash = p->ident_hash;
  if (__atomic_load_n(&p->ident_gen, __ATOMIC_ACQUIRE) != gen) return;
  r->func = func;
  r->seq = seq;
  r->comm_hash = hash;
}

static void start_task(struct fsp_ctx *ctx, struct fsp_slot *s, const struct fsp_event *ev) {
  describe_task(&s->rec, ev);
  s->rec.kind = ev->type == FSP_COLL ? FSP_REC_COLL : FSP_REC_P2P;
  if (ev->comm_hash) s->rec.comm_hash = ev->comm_hash;
  if ((ctx->mask & FSP_KERNEL_CH) && ctx->version >= 3 && ev->nchannels > 0)
    s->holds = ev->nchannels;
}

static void start_child(struct fsp_slot *s, const struct fsp_event *ev) {
  struct fsp_record *r = &s->rec;
  switch (ev->type) {
  case FSP_PROXY_OP:
    r->kind = FSP_REC_PROXY;
    r->rank = ev->rank;
    r->peer = ev->root_or_peer;
    r->channel = (uint8_t)ev->channel;
    r->nsteps = ev->nsteps;
    r->flags = ev->is_send ? FSP_F_SEND : 0;
    if (ev->pid != fsp_self_pid) {
      r->flags |= FSP_F_ORPHAN;
      fsp_count(FSP_C_ORPHANS, 1);
    } else if (!attach(s, ev->parent, FSP_COLL | FSP_P2P)) {
      r->flags |= FSP_F_ORPHAN;
      fsp_count(FSP_C_ORPHANS, 1);
      recall_identity(r, ev->parent);
    } else {
      struct fsp_record *p = &fsp_slot_at(s->parent)->rec;
      r->seq = p->seq;
      r->func = p->func;
      r->comm_hash = p->comm_hash;
    }
    break;
  case FSP_PROXY_STEP:
    if (!attach(s, ev->parent, FSP_PROXY_OP)) fsp_count(FSP_C_ORPHANS, 1);
    break;
  case FSP_KERNEL_CH:
    r->gpu_start = ev->ptimer;
    r->channel = (uint8_t)ev->channel;
    if (!attach(s, ev->parent, FSP_COLL | FSP_P2P)) fsp_count(FSP_C_ORPHANS, 1);
    break;
  default: /* FSP_NET_PLUGIN */
    s->state_ts = s->born_ns;
    r->net_events = 1;
    if (!attach(s, ev->parent, FSP_PROXY_STEP)) fsp_count(FSP_C_ORPHANS, 1);
    break;
  }
}

static void describe_net(struct fsp_record *r, const struct fsp_event *ev) {
  uint32_t type = (uint32_t)ev->net_id & FSP_NET_TYPE_MASK;
  uint32_t ver = (uint32_t)ev->net_id & FSP_NET_VER_MASK;
  if (type == FSP_NET_TYPE_IB && ver == 1 && ev->net_data) {
    const fsp_net_ib_descr_v1_t *d = ev->net_data;
    if (d->type == FSP_NET_IB_QP) {
      r->net_bytes = d->qp.length;
      r->net_qp = (uint32_t)d->qp.qpNum;
      return;
    }
  } else if (type == FSP_NET_TYPE_SOCK && ver == 1 && ev->net_data) {
    const fsp_net_sock_descr_v1_t *d = ev->net_data;
    if (d->type == FSP_NET_SOCK_EVENT) {
      r->net_bytes = d->sock.length;
      r->net_qp = (uint32_t)d->sock.fd;
      return;
    }
  }
  fsp_count(FSP_C_NET_UNKNOWN, 1);
}

fsp_result_t fsp_start(void *context, void **handle, const struct fsp_event *ev) {
  struct fsp_ctx *ctx = context;
  *handle = NULL;
  if (ctx == NULL) return FSP_SUCCESS;
  fsp_count(FSP_C_EVENTS, 1);
  if (!(ev->type & (FSP_COLL | FSP_P2P | FSP_PROXY_OP | FSP_PROXY_STEP | FSP_KERNEL_CH |
                    FSP_NET_PLUGIN))) {
    fsp_count(FSP_C_IGNORED, 1);   /* Group, API, ProxyCtrl, copy-engine events */
    return FSP_SUCCESS;
  }
  uint32_t gen, refs = 1;
  if (ev->type & (FSP_COLL | FSP_P2P) && (ctx->mask & FSP_KERNEL_CH) && ctx->version >= 3)
    refs += (uint32_t)(ev->nchannels > 0 ? ev->nchannels : 0);
  uint32_t idx = new_slot(ctx, ev->type, refs, &gen);
  if (idx == FSP_NIL) return FSP_SUCCESS;
  struct fsp_slot *s = fsp_slot_at(idx);
  if (ev->type & (FSP_COLL | FSP_P2P))
    start_task(ctx, s, ev);
  else
    start_child(s, ev);
  if (ev->type == FSP_NET_PLUGIN) describe_net(&s->rec, ev);
  *handle = fsp_handle(idx, gen);
  return FSP_SUCCESS;
}

static void close_wait(struct fsp_slot *s, uint64_t now) {
  if (s->cur_wait >= 0) s->rec.wait_ns[s->cur_wait] += now - s->state_ts;
  s->cur_wait = -1;
}

static int wait_of(int state) {
  switch (state) {
  case FSP_STEP_SEND_GPU_WAIT: return FSP_W_SEND_GPU;
  case FSP_STEP_SEND_PEER_WAIT_V4: return FSP_W_SEND_PEER;
  case FSP_STEP_SEND_WAIT: return FSP_W_SEND_NET;
  case FSP_STEP_RECV_WAIT: return FSP_W_RECV_NET;
  case FSP_STEP_RECV_FLUSH_WAIT: return FSP_W_RECV_FLUSH;
  case FSP_STEP_RECV_GPU_WAIT: return FSP_W_RECV_GPU;
  default: return -1;
  }
}

fsp_result_t fsp_state(void *handle, int state, uint64_t arg, int has_arg) {
  uint32_t idx, gen;
  if (!fsp_handle_decode(handle, &idx, &gen) || !fsp_is_live(idx, gen)) {
    if (handle) fsp_count(FSP_C_BAD_HANDLE, 1);
    return FSP_SUCCESS;
  }
  struct fsp_slot *s = fsp_slot_at(idx);
  int w = wait_of(state);
  if (s->type == FSP_PROXY_STEP && w >= 0) {
    uint64_t now = fsp_now_ns();
    close_wait(s, now);
    s->cur_wait = (int8_t)w;
    s->state_ts = now;
    /* NCCL passes the proxy's latest transSize with every state; it is this step's size
     * when the send is posted (SendWait) and when the receive completed (RecvFlushWait). */
    if (has_arg && (w == FSP_W_SEND_NET || w == FSP_W_RECV_FLUSH)) s->rec.bytes = arg;
  } else if (s->type == FSP_PROXY_OP && state <= FSP_OP_RECV_DONE && has_arg) {
    if (arg > s->rec.bytes) s->rec.bytes = arg;  /* v1-v3: transSize on proxy op states */
  } else if (s->type == FSP_KERNEL_CH && state == FSP_KERNEL_CH_STOP) {
    if (has_arg) s->rec.gpu_stop = arg;
  } else if (state < 0 || state > FSP_LAST_STATE) {
    fsp_count(FSP_C_UNKNOWN_STATE, 1);
  }
  return FSP_SUCCESS;
}

fsp_result_t fsp_stop(void *handle) {
  uint32_t idx, gen;
  if (!fsp_handle_decode(handle, &idx, &gen) || !fsp_is_live(idx, gen)) {
    if (handle) fsp_count(FSP_C_BAD_HANDLE, 1);
    return FSP_SUCCESS;
  }
  struct fsp_slot *s = fsp_slot_at(idx);
  uint64_t now = fsp_now_ns();
  s->rec.stop_ns = now;
  if (s->type == FSP_PROXY_STEP) close_wait(s, now);
  fsp_release(idx, gen);
  return FSP_SUCCESS;
}
