/* Communicator lifecycle (init, finalize) and the end of an event: fold its sums into
 * its parent, publish its record, free its object, drop its reference on the parent. */
#include <stdlib.h>
#include <unistd.h>
#include "fs_slot.h"

#define DEFAULT_MASK (FSP_COLL | FSP_P2P | FSP_PROXY_OP | FSP_PROXY_STEP | FSP_KERNEL_CH | \
                      FSP_NET_PLUGIN)

extern pid_t fsp_self_pid;
extern uint64_t fsp_stale_ns;
static int live_contexts;

#define ADD(dst, v) __atomic_fetch_add(&(dst), (v), __ATOMIC_RELAXED)

static void set_first(uint32_t *dst, uint32_t v) {
  uint32_t zero = 0;
  if (v) __atomic_compare_exchange_n(dst, &zero, v, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

static void atomic_min(uint64_t *dst, uint64_t v) {
  uint64_t cur = __atomic_load_n(dst, __ATOMIC_RELAXED);
  while ((cur == 0 || v < cur) &&
         !__atomic_compare_exchange_n(dst, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

static void atomic_max(uint64_t *dst, uint64_t v) {
  uint64_t cur = __atomic_load_n(dst, __ATOMIC_RELAXED);
  while (v > cur &&
         !__atomic_compare_exchange_n(dst, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

static void fold_net(struct fsp_record *p, const struct fsp_record *c) {
  ADD(p->net_events, c->net_events);
  ADD(p->net_bytes, c->net_bytes);
  ADD(p->net_ns, c->net_ns);
  set_first(&p->net_qp, c->net_qp);
}

static void fold_kernel(struct fsp_record *p, const struct fsp_record *c) {
  ADD(p->kernel_chs, 1);
  int gpu = c->gpu_start && c->gpu_stop;
  if (!gpu && (__atomic_load_n(&p->flags, __ATOMIC_RELAXED) & FSP_F_GPU_TIMER)) return;
  __atomic_fetch_or(&p->flags, gpu ? FSP_F_GPU_TIMER : FSP_F_KERNEL_HOST, __ATOMIC_RELAXED);
  atomic_min(&p->gpu_start, gpu ? c->gpu_start : c->start_ns);
  atomic_max(&p->gpu_stop, gpu ? c->gpu_stop : c->stop_ns);
}

static void fold(struct fsp_slot *parent, struct fsp_slot *child) {
  struct fsp_record *p = &parent->rec, *c = &child->rec;
  switch (child->type) {
  case FSP_NET_PLUGIN:
    fold_net(p, c);
    return;
  case FSP_PROXY_STEP:
    for (int i = 0; i < FSP_NWAITS; i++) ADD(p->wait_ns[i], c->wait_ns[i]);
    ADD(p->steps, 1);
    ADD(*(p->flags & FSP_F_SEND ? &p->sent_bytes : &p->recv_bytes), c->bytes);
    fold_net(p, c);
    return;
  case FSP_KERNEL_CH:
    fold_kernel(p, c);
    return;
  default: /* FSP_PROXY_OP into its collective or p2p task */
    for (int i = 0; i < FSP_NWAITS; i++) ADD(p->wait_ns[i], c->wait_ns[i]);
    ADD(p->proxy_ops, 1);
    ADD(p->steps, c->steps);
    ADD(p->sent_bytes, c->sent_bytes);
    ADD(p->recv_bytes, c->recv_bytes);
    fold_net(p, c);
  }
}

void fsp_finish(uint32_t idx, int forced) {
  struct fsp_slot *s = fsp_slot_at(idx);
  struct fsp_record *r = &s->rec;
  if (s->type == FSP_PROXY_STEP && s->cur_wait >= 0)   /* only when its stop never came */
    r->wait_ns[s->cur_wait] += fsp_now_ns() - s->state_ts;
  if (s->type == FSP_NET_PLUGIN) r->net_ns = (r->stop_ns ? r->stop_ns : fsp_now_ns()) - s->state_ts;
  if (s->type == FSP_PROXY_OP) {
    r->proxy_ops = 1;
    /* v1-v3 report bytes on proxy op states, not per step */
    if (!r->sent_bytes && !r->recv_bytes)
      *(r->flags & FSP_F_SEND ? &r->sent_bytes : &r->recv_bytes) = r->bytes;
    r->bytes = r->sent_bytes + r->recv_bytes;
  }
  if (forced) r->flags |= FSP_F_INCOMPLETE;
  uint32_t parent = s->parent, parent_gen = s->parent_gen;
  if (parent != FSP_NIL && fsp_is_live(parent, parent_gen)) fold(fsp_slot_at(parent), s);
  if (r->kind) fsp_ring_write(r);
  if (s->type & (FSP_COLL | FSP_P2P)) {
    __atomic_store_n(&s->ident_gen, 0, __ATOMIC_RELEASE);
    s->ident_func = r->func;
    s->ident_seq = r->seq;
    s->ident_hash = r->comm_hash;
    __atomic_store_n(&s->ident_gen, (uint32_t)(__atomic_load_n(&s->life, __ATOMIC_ACQUIRE) >> 32),
                     __ATOMIC_RELEASE);
  }
  fsp_pool_free(idx);
  if (parent != FSP_NIL) fsp_release(parent, parent_gen);
}

static int mask_from_env(void) {
  const char *s = getenv("NCCL_PROFILE_EVENT_MASK");
  if (s == NULL || *s == '\0') return DEFAULT_MASK;
  char *end;
  long m = strtol(s, &end, 0);
  return (*end == '\0' && m >= 0) ? (int)m : DEFAULT_MASK;
}

fsp_result_t fsp_init(void **context, int *mask, int version, const char *name, uint64_t comm_hash,
                      int nnodes, int nranks, int rank, fsp_logger_t log) {
  (void)name;
  *context = NULL;
  fsp_self_pid = getpid();
  const char *stale = getenv("FABRICSCOPE_NCCLPROF_STALE_MS");
  if (stale && atol(stale) > 0) fsp_stale_ns = (uint64_t)atol(stale) * 1000000ull;
  if (fsp_pool_init() != 0) {
    if (log) log(2, 16384, __FILE__, __LINE__,
                 "fabricscope profiler: cannot allocate its event pool; lower "
                 "FABRICSCOPE_NCCLPROF_POOL. NCCL runs without it.");
    return FSP_INTERNAL_ERROR;
  }
  fsp_ring_open(log);
  for (int i = 0; i < FSP_MAX_CTX; i++) {
    struct fsp_ctx *c = fsp_ctx_at(i);
    int expected = 0;
    if (!__atomic_compare_exchange_n(&c->live, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
      continue;
    c->index = i;
    c->version = version;
    c->comm_hash = comm_hash;
    c->nnodes = nnodes;
    c->nranks = nranks;
    c->rank = rank;
    c->log = log;
    c->mask = mask_from_env();
    *mask = c->mask;
    *context = c;
    __atomic_fetch_add(&live_contexts, 1, __ATOMIC_RELAXED);
    fsp_count(FSP_C_CONTEXTS, 1);
    return FSP_SUCCESS;
  }
  fsp_count(FSP_C_CONTEXTS_EXHAUSTED, 1);   /* this communicator runs unprofiled */
  return FSP_SUCCESS;
}

fsp_result_t fsp_finalize(void *context) {
  struct fsp_ctx *c = context;
  if (c == NULL) return FSP_SUCCESS;
  fsp_count(FSP_C_UNFINISHED_AT_FINALIZE, fsp_pool_sweep(0, c));
  __atomic_store_n(&c->live, 0, __ATOMIC_RELEASE);
  if (__atomic_sub_fetch(&live_contexts, 1, __ATOMIC_ACQ_REL) == 0) fsp_ring_close();
  return FSP_SUCCESS;
}
