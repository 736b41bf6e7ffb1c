// SPDX-License-Identifier: Apache-2.0
/* gloo: one event per gloo collective executed by a process (PyTorch's CPU backend).
 *
 * Hooks (uprobes on libtorch_cpu.so, which links gloo in; no kernel struct is read):
 *   gloo::<op>(<Op>Options&) entry      start time; message size from the options
 *   gloo::<op>(<Op>Options&) return     end time; the event goes to the ring buffer
 *   gloo::transport::tcp::UnboundBuffer::send / recv (entry)
 *                                       bytes this thread hands to the transport
 *   c10d::ProcessGroupGloo::send / recv (entry), the SendWork / RecvWork constructor
 *   (entry) and SendWork / RecvWork::wait (entry and return)
 *                                       point-to-point transfers (below)
 *
 * ProcessGroupGloo runs each collective synchronously on one of its worker threads,
 * so entry and return pair up per thread id, and the send/recv calls made by that
 * thread in between belong to the collective (gloo issues them from the calling
 * thread; its device thread only completes them).
 *
 * Reading the options objects: they are C++ classes, not an ABI. Their offsets come
 * from the loader (agent/probes/gloo/layout.py, one table for C and Python) as
 * -DFS_LAYOUT_<OP>=elements,elementSize,out_kind,out,in (-1: absent), and the
 * loader checks every event against independent facts (elements x elementSize ==
 * the output buffer's own size; 0 <= rank < size == WORLD_SIZE) before it trusts
 * them; on mismatch it falls back to the bytes seen in send/recv.
 *
 * Attribution: uprobes fire in every process that maps the library, whatever its
 * network namespace; user space puts processes of other nodes into `deny`.
 *
 * Options (cflags): the layout macros above, -DFS_UB_SIZE_OFF, -DFS_CTX_RANK_OFF,
 * -DFS_CTX_SIZE_OFF, -DMAX_THREADS=n -DMAX_DENY=n -DP2P_WORKS=n -DRINGBUF_PAGES=n.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/ptrace.h>
#include "gloo.h"
#define FS_STATS_SLOTS FS_GS_NSTATS
#include "fs_common.h"

#ifndef MAX_THREADS
#define MAX_THREADS 4096
#endif
#ifndef MAX_DENY
#define MAX_DENY 4096
#endif
#ifndef P2P_WORKS
#define P2P_WORKS 4096
#endif
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 16
#endif
#if !defined(FS_UB_SIZE_OFF) || !defined(FS_CTX_RANK_OFF) || !defined(FS_CTX_SIZE_OFF)
#error "the loader passes the gloo layout (agent/probes/gloo/layout.py)"
#endif

BPF_HASH(active, __u64, struct fs_gloo_event, MAX_THREADS);
BPF_HASH(deny, __u32, __u8, MAX_DENY);
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);
/* A process's first call here queues its pid (new_pids) once (first_seen): user
 * space reads who it is at once, from a thread that the agent's drains and its
 * lowered priority do not hold up, while it lives (a short run may exit before its
 * first event is drained, and then nothing names it). */
BPF_TABLE("lru_hash", __u32, __u8, first_seen, MAX_DENY);
BPF_QUEUE(new_pids, __u32, 1024);
/* Never written: exposes the event layout to the loader's size check. */
BPF_ARRAY(event_layout, struct fs_gloo_event, 1);

/* Size of the UnboundBuffer a unique_ptr (or a vector's first unique_ptr) at `field`
 * points to. A null pointer is a valid "no buffer" (size 0). Returns 0 when read. */
static __always_inline int buffer_size(const char *field, int kind, __u64 *size)
{
	const char *p = 0;

	*size = 0;
	if (bpf_probe_read_user(&p, sizeof(p), field))
		return -1;
	if (kind == FS_OUT_VEC && p && bpf_probe_read_user(&p, sizeof(p), p))
		return -1;
	if (!p)
		return 0;
	return bpf_probe_read_user(size, sizeof(*size), p + FS_UB_SIZE_OFF) ? -1 : 0;
}

static __always_inline void notice_process(__u32 tgid)
{
	__u8 one = 1;

	if (first_seen.lookup(&tgid) || first_seen.insert(&tgid, &one))
		return;
	if (new_pids.push(&tgid, 0))
		stat_add(FS_GS_NOTICES_LOST, 1);
}

static __always_inline int on_entry(struct pt_regs *ctx, __u32 op, long elements_off,
				    long elemsize_off, int out_kind, long out_off, long in_off)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	const char *opts = (const char *)PT_REGS_PARM1(ctx);
	const char *context = 0;
	struct fs_gloo_event ev = {};

	if (deny.lookup(&tgid)) {
		stat_add(FS_GS_FILTERED, 1);
		return 0;
	}
	notice_process(tgid);
	ev.pid = tgid;
	ev.tid = (__u32)id;
	ev.op = op;
	ev.peer = -1;
	ev.ctx_rank = -1;
	ev.ctx_size = -1;
	/* options.context is a std::shared_ptr: its first word is the Context* */
	if (bpf_probe_read_user(&context, sizeof(context), opts) || !context ||
	    bpf_probe_read_user(&ev.ctx_rank, 4, context + FS_CTX_RANK_OFF) ||
	    bpf_probe_read_user(&ev.ctx_size, 4, context + FS_CTX_SIZE_OFF))
		ev.flags |= FS_F_NO_CONTEXT;
	if (elements_off >= 0 && bpf_probe_read_user(&ev.elements, 8, opts + elements_off))
		ev.flags |= FS_F_NO_COUNT;
	if (elemsize_off >= 0 && bpf_probe_read_user(&ev.elem_size, 8, opts + elemsize_off))
		ev.flags |= FS_F_NO_COUNT;
	if (out_kind != FS_OUT_NONE && buffer_size(opts + out_off, out_kind, &ev.out_size))
		ev.flags |= FS_F_NO_OUT;
	if (in_off >= 0 && buffer_size(opts + in_off, FS_OUT_PTR, &ev.in_size))
		ev.flags |= FS_F_NO_IN;
	if (active.lookup(&id))
		stat_add(FS_GS_UNFINISHED, 1);
	ev.start_ns = bpf_ktime_get_ns();
	if (active.update(&id, &ev))
		stat_add(FS_GS_ACTIVE_FULL, 1);
	else
		stat_add(FS_GS_ENTRIES, 1);
	return 0;
}

#define FS_ENTRY(name, op, layout) \
	int name##_entry(struct pt_regs *ctx) { return on_entry(ctx, op, layout); }

FS_ENTRY(allreduce, FS_GLOO_ALLREDUCE, FS_LAYOUT_ALLREDUCE)
FS_ENTRY(broadcast, FS_GLOO_BROADCAST, FS_LAYOUT_BROADCAST)
FS_ENTRY(allgather, FS_GLOO_ALLGATHER, FS_LAYOUT_ALLGATHER)
FS_ENTRY(allgatherv, FS_GLOO_ALLGATHERV, FS_LAYOUT_ALLGATHERV)
FS_ENTRY(reduce, FS_GLOO_REDUCE, FS_LAYOUT_REDUCE)
FS_ENTRY(gather, FS_GLOO_GATHER, FS_LAYOUT_GATHER)
FS_ENTRY(scatter, FS_GLOO_SCATTER, FS_LAYOUT_SCATTER)
FS_ENTRY(alltoall, FS_GLOO_ALLTOALL, FS_LAYOUT_ALLTOALL)
FS_ENTRY(alltoallv, FS_GLOO_ALLTOALLV, FS_LAYOUT_ALLTOALLV)
FS_ENTRY(barrier, FS_GLOO_BARRIER, FS_LAYOUT_BARRIER)

/* Attached as the uretprobe of every collective above. */
int collective_return(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	struct fs_gloo_event *ev = active.lookup(&id);

	if (!ev) {
		if (!deny.lookup(&tgid))
			stat_add(FS_GS_ORPHAN_RET, 1);
		return 0;
	}
	ev->end_ns = bpf_ktime_get_ns();
	fs_count_emit(events.ringbuf_output(ev, sizeof(*ev), 0), FS_GS_EMITTED, FS_GS_LOST);
	active.delete(&id);
	return 0;
}

/* UnboundBuffer::send(int rank, u64 slot, size_t offset, size_t nbytes) and the two
 * recv overloads (int or std::vector<int> by invisible reference: same registers).
 * nbytes == SIZE_MAX means "the rest of the buffer from offset". */
static __always_inline __u64 transfer_bytes(struct pt_regs *ctx)
{
	__u64 nbytes = PT_REGS_PARM5(ctx);
	__u64 size = 0;

	if (nbytes != ~0ULL)
		return nbytes;
	if (bpf_probe_read_user(&size, sizeof(size),
				(const char *)PT_REGS_PARM1(ctx) + FS_UB_SIZE_OFF))
		return 0;
	return size - PT_REGS_PARM4(ctx);
}

int buffer_send(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	struct fs_gloo_event *ev = active.lookup(&id);

	if (!ev) {
		if (!deny.lookup(&tgid))
			stat_add(FS_GS_SENDS_OUTSIDE, 1);
		return 0;
	}
	ev->sent_bytes += transfer_bytes(ctx);
	ev->sends += 1;
	return 0;
}

int buffer_recv(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	struct fs_gloo_event *ev = active.lookup(&id);

	if (!ev) {
		if (!deny.lookup(&tgid))
			stat_add(FS_GS_RECVS_OUTSIDE, 1);
		return 0;
	}
	ev->recv_bytes += transfer_bytes(ctx);
	ev->recvs += 1;
	return 0;
}

/* Point-to-point transfers: torch.distributed.send/recv (and isend/irecv) call
 * ProcessGroupGloo::send/recv, which post the tensor's UnboundBuffer and return a
 * SendWork/RecvWork that the caller waits on; gloo::<op>() is not involved, so the
 * collective hooks never see them. An event runs from the call to the return of its
 * work's wait(): for a blocking send or recv the caller's whole time in it (a recv:
 * waiting for the peer, then the transfer).
 *
 * The call (entry; it returns c10::intrusive_ptr<Work> through a hidden pointer, so
 * the arguments are this=PARM2, tensors=PARM3, peer rank=PARM4) notes the start and
 * the peer per thread; the work's constructor, which the call runs on the same
 * thread (this=PARM1, the UnboundBuffer's unique_ptr by invisible reference=PARM3),
 * moves them to `p2p_works` under the work's address with the buffer's size; wait()
 * (this=PARM1) finds them there and emits at its return. */
struct fs_p2p_call {
	__u64 start_ns;
	__s32 peer;
	__u32 op;
};
BPF_HASH(p2p_calls, __u64, struct fs_p2p_call, MAX_THREADS);
BPF_TABLE("lru_hash", __u64, struct fs_gloo_event, p2p_works, P2P_WORKS);
BPF_HASH(p2p_waits, __u64, __u64, MAX_THREADS);

static __always_inline int p2p_call(struct pt_regs *ctx, __u32 op)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;

	if (deny.lookup(&tgid)) {
		stat_add(FS_GS_FILTERED, 1);
		return 0;
	}
	notice_process(tgid);
	struct fs_p2p_call call = {.start_ns = bpf_ktime_get_ns(), .op = op,
				   .peer = (__s32)PT_REGS_PARM4(ctx)};
	p2p_calls.update(&id, &call);
	return 0;
}

int p2p_send_call(struct pt_regs *ctx) { return p2p_call(ctx, FS_GLOO_SEND); }
int p2p_recv_call(struct pt_regs *ctx) { return p2p_call(ctx, FS_GLOO_RECV); }

static __always_inline int p2p_work_made(struct pt_regs *ctx, __u32 op)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	struct fs_p2p_call *call = p2p_calls.lookup(&id);

	if (!call || call->op != op) {
		if (!deny.lookup(&tgid))
			stat_add(FS_GS_P2P_UNPAIRED, 1);
		return 0;
	}
	struct fs_gloo_event ev = {};

	ev.start_ns = call->start_ns;
	ev.peer = call->peer;
	ev.pid = tgid;
	ev.tid = (__u32)id;
	ev.op = op;
	ev.ctx_rank = -1;
	ev.ctx_size = -1;
	if (buffer_size((const char *)PT_REGS_PARM3(ctx), FS_OUT_PTR, &ev.out_size))
		ev.flags |= FS_F_NO_OUT;
	p2p_calls.delete(&id);
	__u64 work = PT_REGS_PARM1(ctx);
	/* a work at this address before: freed without a wait that returned */
	if (p2p_works.lookup(&work))
		stat_add(FS_GS_P2P_UNWAITED, 1);
	if (p2p_works.update(&work, &ev))
		stat_add(FS_GS_ACTIVE_FULL, 1);
	else
		stat_add(FS_GS_ENTRIES, 1);
	return 0;
}

int p2p_send_work(struct pt_regs *ctx) { return p2p_work_made(ctx, FS_GLOO_SEND); }
int p2p_recv_work(struct pt_regs *ctx) { return p2p_work_made(ctx, FS_GLOO_RECV); }

int p2p_wait_entry(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u64 work = PT_REGS_PARM1(ctx);

	if (p2p_works.lookup(&work))
		p2p_waits.update(&id, &work);
	return 0;
}

int p2p_wait_return(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u64 *work = p2p_waits.lookup(&id);

	if (!work)
		return 0;
	__u64 key = *work;
	p2p_waits.delete(&id);
	struct fs_gloo_event *ev = p2p_works.lookup(&key);
	if (!ev)
		return 0;
	ev->end_ns = bpf_ktime_get_ns();
	fs_count_emit(events.ringbuf_output(ev, sizeof(*ev), 0), FS_GS_EMITTED, FS_GS_LOST);
	p2p_works.delete(&key);
	return 0;
}
