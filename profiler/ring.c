/* The per-process shared-memory ring the agent reads (layout: fs_ncclprof.h).
 *
 * Opened once, at the first communicator's init (the only file work the plugin does);
 * NCCL's event callbacks only copy records into the mapping. When the file cannot be
 * created the plugin keeps aggregating and counts every record as ring_full in a
 * private header, so NCCL runs on unchanged.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "fs_ncclprof.h"

#define DEFAULT_RECORDS 8192
#define MAX_RECORDS (1u << 22)

static struct fsp_ring_header fallback_header;
static struct fsp_ring_header *hdr = &fallback_header;
static struct fsp_record *records;
static int ring_state;            /* 0 closed, 1 opening, 2 open (or failed: records NULL) */

uint64_t fsp_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t real_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t capacity_from_env(void) {
  const char *s = getenv("FABRICSCOPE_NCCLPROF_RECORDS");
  long n = s ? strtol(s, NULL, 10) : DEFAULT_RECORDS;
  if (n < 16 || n > (long)MAX_RECORDS) n = DEFAULT_RECORDS;
  uint32_t p = 16;
  while (p < (uint32_t)n) p <<= 1;  /* a power of two: index & (capacity - 1) */
  return p;
}

static void fill_header(struct fsp_ring_header *h, uint32_t capacity) {
  h->magic = FSP_RING_MAGIC;
  h->version = FSP_RING_VERSION;
  h->header_size = FSP_HEADER_SIZE;
  h->record_size = sizeof(struct fsp_record);
  h->capacity = capacity;
  h->pid = (uint32_t)getpid();
  h->mono_ns_at_open = fsp_now_ns();
  h->real_ns_at_open = real_ns();
}

static int map_ring(fsp_logger_t log, uint32_t capacity) {
  const char *dir = getenv("FABRICSCOPE_NCCLPROF_DIR");
  char path[512];
  snprintf(path, sizeof(path), "%s/fabricscope-ncclprof-%d.ring", dir && *dir ? dir : "/dev/shm",
           (int)getpid());
  size_t len = FSP_HEADER_SIZE + (size_t)capacity * sizeof(struct fsp_record);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  void *m = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, (off_t)len) == 0)
    m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  if (fd >= 0) close(fd);
  if (m == MAP_FAILED) {
    if (log)
      log(2, 16384, __FILE__, __LINE__,
          "fabricscope profiler: cannot create %s (%s); set FABRICSCOPE_NCCLPROF_DIR to a "
          "writable directory. Records are counted as dropped.", path, strerror(err));
    return -1;
  }
  struct fsp_ring_header *h = m;
  records = (struct fsp_record *)((char *)m + FSP_HEADER_SIZE);
  fill_header(h, capacity);
  __atomic_store_n(&hdr, h, __ATOMIC_RELEASE);
  return 0;
}

int fsp_ring_open(fsp_logger_t log) {
  int expected = 0;
  if (!__atomic_compare_exchange_n(&ring_state, &expected, 1, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE)) {
    while (__atomic_load_n(&ring_state, __ATOMIC_ACQUIRE) == 1) {
    }
    return records ? 0 : -1;
  }
  uint32_t capacity = capacity_from_env();
  fill_header(&fallback_header, capacity);
  int rc = map_ring(log, capacity);
  __atomic_store_n(&ring_state, 2, __ATOMIC_RELEASE);
  return rc;
}

void fsp_ring_close(void) {
  __atomic_store_n(&hdr->closed, 1, __ATOMIC_RELEASE);
}

void fsp_count(enum fsp_counter c, uint64_t n) {
  __atomic_fetch_add(&hdr->counters[c], n, __ATOMIC_RELAXED);
}

void fsp_ring_write(struct fsp_record *rec) {
  struct fsp_ring_header *h = __atomic_load_n(&hdr, __ATOMIC_ACQUIRE);
  if (records == NULL) {
    fsp_count(FSP_C_RING_FULL, 1);
    return;
  }
  uint64_t w = __atomic_load_n(&h->write_index, __ATOMIC_ACQUIRE);
  do {
    if (w - __atomic_load_n(&h->read_index, __ATOMIC_ACQUIRE) >= h->capacity) {
      fsp_count(FSP_C_RING_FULL, 1);
      return;
    }
  } while (!__atomic_compare_exchange_n(&h->write_index, &w, w + 1, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE));
  struct fsp_record *dst = &records[w & (h->capacity - 1)];
  memcpy((char *)dst + sizeof(dst->commit), (char *)rec + sizeof(rec->commit),
         sizeof(*rec) - sizeof(rec->commit));
  __atomic_store_n(&dst->commit, w + 1, __ATOMIC_RELEASE);
  fsp_count(FSP_C_RECORDS, 1);
}
