/* The fixed pool of event objects, its lock-free free list and generation-checked handles.
 *
 * A handle NCCL holds is (generation << 32) | (index + 1), never a pointer: NCCL only
 * passes handles back to us (stop, state, parentObj), so a handle to an event that was
 * finished and reused is recognised by its generation instead of corrupting the new
 * occupant. Every reference is taken and dropped with a CAS that checks the generation.
 */
#include <stdlib.h>
#include <string.h>
#include "fs_slot.h"

#define GEN(v) ((uint32_t)((v) >> 32))
#define REFS(v) ((uint32_t)(v))
#define DEFAULT_POOL 16384
#define MAX_POOL (1u << 24)

static struct fsp_slot *slots;
static uint32_t nslots;
static uint64_t free_head;        /* tag << 32 | index (the tag defeats ABA) */
static uint32_t in_use;
static int pool_state;            /* 0 none, 1 building, 2 ready */

static uint32_t pool_size_from_env(void) {
  const char *s = getenv("FABRICSCOPE_NCCLPROF_POOL");
  long n = s ? strtol(s, NULL, 10) : DEFAULT_POOL;
  return (n < 16 || n > (long)MAX_POOL) ? DEFAULT_POOL : (uint32_t)n;
}

int fsp_pool_init(void) {
  int expected = 0;
  if (__atomic_compare_exchange_n(&pool_state, &expected, 1, 0, __ATOMIC_ACQ_REL,
                                  __ATOMIC_ACQUIRE)) {
    uint32_t n = pool_size_from_env();
    struct fsp_slot *s = calloc(n, sizeof(*s));
    if (s == NULL) {
      __atomic_store_n(&pool_state, 0, __ATOMIC_RELEASE);
      return -1;
    }
    for (uint32_t i = 0; i < n; i++) {
      s[i].next = i + 1 < n ? i + 1 : FSP_NIL;
      s[i].life = 1ull << 32;
    }
    slots = s;
    nslots = n;
    free_head = 0;
    __atomic_store_n(&pool_state, 2, __ATOMIC_RELEASE);
    return 0;
  }
  while (__atomic_load_n(&pool_state, __ATOMIC_ACQUIRE) == 1) {
  }
  return __atomic_load_n(&pool_state, __ATOMIC_ACQUIRE) == 2 ? 0 : -1;
}

uint32_t fsp_pool_size(void) { return nslots; }
uint32_t fsp_pool_in_use(void) { return __atomic_load_n(&in_use, __ATOMIC_RELAXED); }
struct fsp_slot *fsp_slot_at(uint32_t idx) { return &slots[idx]; }

uint32_t fsp_pool_alloc(uint32_t refs, uint32_t *gen) {
  uint64_t head = __atomic_load_n(&free_head, __ATOMIC_ACQUIRE);
  for (;;) {
    uint32_t idx = (uint32_t)head;
    if (idx == FSP_NIL || slots == NULL) return FSP_NIL;
    uint32_t next = __atomic_load_n(&slots[idx].next, __ATOMIC_RELAXED);
    uint64_t want = ((head >> 32) + 1) << 32 | next;
    if (__atomic_compare_exchange_n(&free_head, &head, want, 1, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      struct fsp_slot *s = &slots[idx];
      uint32_t g = GEN(__atomic_load_n(&s->life, __ATOMIC_RELAXED));
      memset((char *)s + offsetof(struct fsp_slot, type), 0,
             sizeof(*s) - offsetof(struct fsp_slot, type));
      s->parent = FSP_NIL;
      s->cur_wait = -1;
      __atomic_store_n(&s->life, (uint64_t)g << 32 | refs, __ATOMIC_RELEASE);
      __atomic_fetch_add(&in_use, 1, __ATOMIC_RELAXED);
      *gen = g;
      return idx;
    }
  }
}

void fsp_pool_free(uint32_t idx) {
  struct fsp_slot *s = &slots[idx];
  uint32_t g = GEN(__atomic_load_n(&s->life, __ATOMIC_RELAXED)) + 1;
  __atomic_store_n(&s->life, (uint64_t)(g ? g : 1) << 32, __ATOMIC_RELEASE);
  uint64_t head = __atomic_load_n(&free_head, __ATOMIC_ACQUIRE);
  for (;;) {
    __atomic_store_n(&s->next, (uint32_t)head, __ATOMIC_RELAXED);
    uint64_t want = ((head >> 32) + 1) << 32 | idx;
    if (__atomic_compare_exchange_n(&free_head, &head, want, 1, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
      break;
  }
  __atomic_fetch_sub(&in_use, 1, __ATOMIC_RELAXED);
}

void *fsp_handle(uint32_t idx, uint32_t gen) {
  return (void *)(uintptr_t)((uint64_t)gen << 32 | (uint64_t)(idx + 1));
}

int fsp_handle_decode(const void *h, uint32_t *idx, uint32_t *gen) {
  uint64_t v = (uint64_t)(uintptr_t)h;
  uint32_t low = (uint32_t)v;
  if (h == NULL || low == 0 || low > nslots) return 0;
  *idx = low - 1;
  *gen = (uint32_t)(v >> 32);
  return 1;
}

int fsp_is_live(uint32_t idx, uint32_t gen) {
  uint64_t v = __atomic_load_n(&slots[idx].life, __ATOMIC_ACQUIRE);
  return GEN(v) == gen && REFS(v) > 0;
}

int fsp_acquire(uint32_t idx, uint32_t gen) {
  uint64_t v = __atomic_load_n(&slots[idx].life, __ATOMIC_ACQUIRE);
  while (GEN(v) == gen && REFS(v) > 0) {
    if (__atomic_compare_exchange_n(&slots[idx].life, &v, v + 1, 1, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
      return 1;
  }
  return 0;
}

/* Drops one reference; the thread that drops the last one finishes the event. */
int fsp_release(uint32_t idx, uint32_t gen) {
  uint64_t v = __atomic_load_n(&slots[idx].life, __ATOMIC_ACQUIRE);
  while (GEN(v) == gen && REFS(v) > 0) {
    if (__atomic_compare_exchange_n(&slots[idx].life, &v, v - 1, 1, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      if (REFS(v) == 1) {
        fsp_finish(idx, 0);
        return 1;
      }
      return 0;
    }
  }
  return -1;
}

/* Takes every reference of a live event at once, so that exactly one thread finishes it. */
static int seize(uint32_t idx) {
  uint64_t v = __atomic_load_n(&slots[idx].life, __ATOMIC_ACQUIRE);
  while (REFS(v) > 0) {
    if (__atomic_compare_exchange_n(&slots[idx].life, &v, v & ~0xffffffffull, 1,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      return 1;
  }
  return 0;
}

uint32_t fsp_pool_sweep(uint64_t born_before_ns, const struct fsp_ctx *ctx) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < nslots; i++) {
    struct fsp_slot *s = &slots[i];
    if (REFS(__atomic_load_n(&s->life, __ATOMIC_ACQUIRE)) == 0) continue;
    if (ctx != NULL && s->ctx != ctx->index) continue;
    if (born_before_ns && __atomic_load_n(&s->born_ns, __ATOMIC_RELAXED) > born_before_ns)
      continue;
    if (seize(i)) {
      fsp_finish(i, 1);
      n++;
    }
  }
  return n;
}
