// SPDX-License-Identifier: Apache-2.0
/* Tight loop of NCCL calls for `fabricscope bench uprobe-cost` (bench/uprobe_cost.py).
 *
 * Usage: uprobe_cost LIBNCCL CALLS
 * dlopens the real libnccl.so.2, calls ncclAllReduce(NULL, NULL, 1024, ncclFloat32,
 * ncclSum, NULL, NULL) CALLS times (returns ncclInvalidArgument without a GPU, after
 * NCCL's argument checks: the entry point a training process calls) and prints the
 * mean ns per call. A warm-up first, so page faults and lazy binding stay out.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*allreduce_fn)(const void *, void *, size_t, int, int, void *, void *);

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s LIBNCCL CALLS\n", argv[0]);
		return 2;
	}
	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
		return 2;
	}
	allreduce_fn allreduce = (allreduce_fn)dlsym(lib, "ncclAllReduce");
	long calls = atol(argv[2]);
	if (!allreduce || calls <= 0) {
		fprintf(stderr, "no ncclAllReduce in %s, or CALLS <= 0\n", argv[1]);
		return 2;
	}
	int rc = 0;
	for (long i = 0; i < 1000; i++)
		rc |= allreduce(NULL, NULL, 1024, 7, 0, NULL, NULL);
	double t0 = now_ns();
	for (long i = 0; i < calls; i++)
		rc |= allreduce(NULL, NULL, 1024, 7, 0, NULL, NULL);
	double t1 = now_ns();
	printf("%.3f %d\n", (t1 - t0) / calls, rc);
	return 0;
}
