/* Drives ncclProfiler_v6 of the library named in argv[1] as NCCL does (the harness's order,
 * tests/support/nccl_profiler_host.py), N collectives a round; prints ns per collective. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "fs_nccl_abi.h"

static uint64_t now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void one(const fsp_profiler_v6_t *p, void *ctx, uint64_t seq, fsp_net_ib_descr_v1_t *qp) {
  fsp_descr_v6_t d = {0};
  fsp_state_args_v4_t a = {0};
  void *group, *api, *coll, *kch[2], *op, *step, *net;
  d.type = FSP_GROUP; p->startEvent(ctx, &group, &d);
  d.type = FSP_COLL_API; p->startEvent(ctx, &api, &d);
  d = (fsp_descr_v6_t){.type = FSP_COLL, .parentObj = api, .rank = 3};
  d.coll.seqNumber = seq; d.coll.func = "AllReduce"; d.coll.count = 1 << 20;
  d.coll.datatype = "ncclBfloat16"; d.coll.nChannels = 2; d.coll.algo = "RING";
  d.coll.proto = "SIMPLE"; d.coll.parentGroup = group;
  p->startEvent(ctx, &coll, &d);
  p->stopEvent(coll); p->stopEvent(api); p->stopEvent(group);
  for (int c = 0; c < 2; c++) {
    d = (fsp_descr_v6_t){.type = FSP_KERNEL_CH, .parentObj = coll};
    d.kernelCh.channelId = (uint8_t)c; d.kernelCh.pTimer = seq * 10;
    p->startEvent(ctx, &kch[c], &d);
  }
  for (int c = 0; c < 2; c++)
    for (int send = 1; send >= 0; send--) {
      d = (fsp_descr_v6_t){.type = FSP_PROXY_OP, .parentObj = coll};
      d.proxyOp.pid = getpid(); d.proxyOp.channelId = (uint8_t)c; d.proxyOp.peer = 1;
      d.proxyOp.nSteps = 4; d.proxyOp.isSend = send;
      p->startEvent(ctx, &op, &d);
      for (int s = 0; s < 4; s++) {
        d = (fsp_descr_v6_t){.type = FSP_PROXY_STEP, .parentObj = op};
        p->startEvent(ctx, &step, &d);
        int st[2][3] = {{10, 11, 12}, {8, 20, 9}};
        for (int k = 0; k < 3; k++) {
          a.proxyStep.transSize = 65536;
          p->recordEventState(step, st[send][k], &a);
        }
        if (send) {
          d = (fsp_descr_v6_t){.type = FSP_NET_PLUGIN, .parentObj = step};
          d.netPlugin.id = FSP_NET_TYPE_IB | 1; d.netPlugin.data = qp;
          p->startEvent(ctx, &net, &d);
          p->stopEvent(net);
        }
        p->stopEvent(step);
      }
      p->stopEvent(op);
    }
  for (int c = 0; c < 2; c++) {
    a.kernelCh.pTimer = seq * 10 + 5;
    p->recordEventState(kch[c], FSP_KERNEL_CH_STOP, &a);
    p->stopEvent(kch[c]);
  }
}

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  const fsp_profiler_v6_t *p = lib ? dlsym(lib, "ncclProfiler_v6") : NULL;
  if (p == NULL) { fprintf(stderr, "%s\n", dlerror()); return 1; }
  int rounds = atoi(argv[2]), n = atoi(argv[3]), mask = 0;
  void *ctx;
  p->init(&ctx, 0xC0FFEE, &mask, "bench", 2, 16, 3, NULL);
  fsp_net_ib_descr_v1_t qp = {.type = 1};
  qp.qp.length = 65536;
  for (int r = 0; r < rounds; r++) {
    uint64_t t0 = now();
    for (int i = 0; i < n; i++) one(p, ctx, (uint64_t)r * n + i, &qp);
    printf("%.1f\n", (double)(now() - t0) / n);
    fflush(stdout);
  }
  p->finalize(ctx);
  return 0;
}
