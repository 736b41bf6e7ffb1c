/* One pooled event object (private to pool.c and events.c). */
#ifndef FS_SLOT_H
#define FS_SLOT_H

#include "fs_ncclprof.h"

#define FSP_MAX_CTX 256

struct fsp_ctx {
  uint64_t comm_hash;
  int version, rank, nranks, nnodes, mask;
  int index;                      /* position in the context table */
  int live;
  fsp_logger_t log;
};

struct fsp_slot {
  uint64_t life;                  /* generation << 32 | references; 0 references = free */
  uint32_t next;                  /* free-list link */
  /* Identity of the last collective/p2p published from this object, kept past its free
   * (alloc clears only from `type` on) so that a proxy op starting after its collective
   * was published still names it (comm hash, function, seq). */
  uint32_t ident_gen;
  uint8_t ident_func;
  uint64_t ident_seq, ident_hash;
  int type;                       /* enum fsp_event_type of the event it holds */
  int8_t cur_wait;                /* proxy step: enum fsp_wait it is in, -1 none */
  uint16_t ctx;                   /* index in the context table */
  int32_t holds;                  /* coll/p2p: references kept for kernel channels to come */
  uint32_t parent, parent_gen;    /* the parent event this one holds a reference on */
  uint64_t born_ns;               /* start time, for the stale sweep */
  uint64_t state_ts;              /* proxy step: when cur_wait began; net: start */
  struct fsp_record rec;          /* coll/p2p/proxy op: the record it builds; step/net: sums */
};

struct fsp_ctx *fsp_ctx_at(int index);

#endif
