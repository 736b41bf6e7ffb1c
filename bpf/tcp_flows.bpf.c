// SPDX-License-Identifier: Apache-2.0
/* tcp_flows: per-flow RTT/cwnd/bytes aggregated in the kernel per window, flow
 * lifecycle and resets, plus everything tcp_retransmit does.
 *
 * One object with the retransmit program (included below, unchanged), so the
 * flow windows see the same retransmits with their TC egress segment counts
 * without a second TC hook on every packet.
 *
 * Hooks (stable ABI only; no kernel struct is read), each optional (-D flags):
 *   tcp/tcp_probe           FS_WITH_TCP_PROBE   per segment received on an
 *       established socket, before it is processed: snd_una, snd_nxt, srtt (in
 *       microseconds: the tracepoint stores tp->srtt_us >> 3; tp->srtt_us itself is
 *       usec << 3), snd_cwnd, ssthresh of the socket as the previous segment left it
 *   sock/inet_sock_set_state FS_WITH_SET_STATE  opens (-> ESTABLISHED), closes (-> CLOSE);
 *       -> SYN_SENT runs inside connect(), so the current task is the flow's owner:
 *       its pid rides on the flow's events (user space then needs no /proc scan,
 *       which a connection closed before the next scan would escape)
 *   tcp/tcp_send_reset       FS_WITH_SEND_RESET  resets sent
 *   tcp/tcp_receive_reset    FS_WITH_RECV_RESET  resets received
 *
 * Windows: user space owns a generation number (`window`[0], starting at 1) and
 * bumps it at each window end. Each flow's per-CPU value holds two slots; a hit
 * writes slot[gen & 1], first clearing it when it still holds an older
 * generation. After a bump from g to g+1 nothing writes slot[g & 1] until g+2,
 * so user space reads the finished window without racing the writers and
 * without deleting entries (a delete-after-read would lose the hits between).
 *
 * RTT samples: a hit whose snd_una moved since the flow's previous hit (the
 * segment before acknowledged data, so tcp_ack updated srtt): pure receivers
 * and duplicate ACKs add no samples. snd_una and snd_nxt deltas are u32
 * differences (wrap-safe); a "backwards" difference (>= 2^31) is ignored.
 *
 * Options (cflags): those of tcp_retransmit.bpf.c, -DMAX_FLOWS=n (flow map),
 * -DFS_TP_RST_REASON (tcp_send_reset has `reason`) and
 * -DFS_DECLARE_RST_REASON (its type is an enum the 6.1 headers lack).
 */
#ifdef FS_DECLARE_RST_REASON
/* Only the size matters to the tracepoint struct BCC generates: an enum is 4 bytes. */
enum sk_rst_reason { FS_SK_RST_REASON_PLACEHOLDER = 0 };
#endif

#ifndef FS_TRANSFER_GAP_NS
#define FS_TRANSFER_GAP_NS 2000000       /* config tcp_transfer_gap_us */
#endif
/* TC egress also keeps each flow's last SYN-ACK: recover_received's baseline for
 * accepted sockets. */
#define FS_REMEMBER_SYNACK 1
/* ... and where a socket's data resumed after a pause as long as a transfer's gap:
 * the sequence number at which the transfer that resumption began starts
 * (add_transfer). */
#define FS_SEND_PAUSE_NS FS_TRANSFER_GAP_NS
#if defined(FS_WITH_SET_STATE) && defined(FS_RAW_RETRANSMIT)
/* The raw tcp_destroy_sock program (never skipped) closes a flow whose
 * inet_sock_set_state hit to CLOSE the kernel skipped (below). */
static __always_inline int close_at_destroy(__u64 sk);
#define FS_ON_DESTROY(sk) close_at_destroy(sk)
/* TC egress (never skipped) closes the flow of a freed socket whose address a new
 * socket reuses, when no hook reported its close (below). */
static __always_inline void close_at_reuse(__u64 sk, __u64 last_tx_ns);
#define FS_ON_STALE(sk, last_tx_ns) close_at_reuse(sk, last_tx_ns)
/* TC egress (never skipped) opens a flow whose inet_sock_set_state hit to
 * ESTABLISHED the kernel skipped (below). */
static __always_inline void open_at_first_ack(__u64 sk, const void *flow, __u16 family,
					      __u8 active, __u64 now);
#define FS_ON_OPEN_TX(sk, flow, family, active, now) \
	open_at_first_ack(sk, flow, family, active, now)
/* ... and keeps the socket's cookie for user space's sweep (below). */
static __always_inline void keep_cookie(__u64 sk, struct __sk_buff *skb);
#define FS_ON_CONNECTED_TX(sk, skb) keep_cookie(sk, skb)
/* ... and ties a connecting socket's received-byte recovery to its handshake ACK
 * (below). */
static __always_inline void tie_at_handshake(__u64 sk, __u32 ack);
#define FS_ON_HANDSHAKE_ACK(sk, ack) tie_at_handshake(sk, ack)
#endif
#include "tcp_retransmit.h"
#include "tcp_flows.h"
/* One counter array for both programs: tcp_retransmit's, then this one's. */
#define FS_STATS_SLOTS (FS_NSTATS + FS_NFSTATS)
#include "tcp_retransmit.bpf.c"

#ifndef MAX_FLOWS
#define MAX_FLOWS 4096
#endif
#ifndef FS_TRANSFER_MIN_BYTES
#define FS_TRANSFER_MIN_BYTES 65536      /* config tcp_transfer_min_bytes */
#endif
#ifndef FS_TRANSFER_TAIL_NS
#define FS_TRANSFER_TAIL_NS 20000000     /* config tcp_transfer_tail_us */
#endif


BPF_TABLE("lru_percpu_hash", struct fs_flow, struct fs_flow_stat, flowstats, MAX_FLOWS);
BPF_TABLE("lru_hash", __u64, struct fs_sock, socks, FLOW_ENTRIES);
/* A zeroed entry, never written: new entries are copied from it, not built on the
 * stack (an entry is ~170 bytes, and TC egress reaches open_flow with little of its
 * 512 bytes left). */
BPF_PERCPU_ARRAY(sock_zero, struct fs_sock, 1);
/* TC egress's event under construction: its stack is full (tcp_retransmit.bpf.c's
 * tc_egress inlines every hook). Only TC egress writes it, and TC egress does not
 * nest on a CPU (process-context transmits run with bottom halves off). */
BPF_PERCPU_ARRAY(tc_event, struct fs_flow_event, 1);
/* The socket user space's sweep replays tcp_destroy_sock for (BPF_PROG_TEST_RUN),
 * with the cookie it had: its close is then counted as swept and stamped with its
 * last packet. */
BPF_ARRAY(sweeping, struct fs_sweep, 1);

/* A new, zeroed entry for socket sk (made now); NULL when the map update failed. */
static __always_inline struct fs_sock *new_sock(__u64 sk, __u64 now)
{
	int zero = 0;
	struct fs_sock *z = sock_zero.lookup(&zero);

	if (!z)
		return 0;
	socks.update(&sk, z);
	struct fs_sock *s = socks.lookup(&sk);
	if (s)
		s->made_ns = now;
	return s;
}
/* Never written: the zero value new flow entries start from (too big for the stack). */
BPF_PERCPU_ARRAY(zero_stat, struct fs_flow_stat, 1);
BPF_ARRAY(window, __u32, 1);
BPF_RINGBUF_OUTPUT(flow_events, RINGBUF_PAGES);
BPF_ARRAY(flow_event_layout, struct fs_flow_event, 1);
BPF_ARRAY(sock_layout, struct fs_sock, 1);

/* This program's counters follow tcp_retransmit's in `stats`. */
static __always_inline void fstat_add(int idx, __u64 n)
{
	stat_add(FS_NSTATS + idx, n);
}

/* 0 when the event went out; else it is lost (counted). */
static __always_inline long emit_flow(struct fs_flow_event *ev)
{
	long err = flow_events.ringbuf_output(ev, sizeof(*ev), 0);

	fs_count_emit(err, FS_NSTATS + FS_FSTAT_EMITTED, FS_NSTATS + FS_FSTAT_LOST);
	return err;
}

#ifdef FS_WITH_TCP_PROBE
/* The flow's slot for generation `gen` on this CPU, cleared when it held an older one. */
static __always_inline struct fs_flow_slot *slot_for(struct fs_flow *flow, __u32 gen)
{
	struct fs_flow_stat *st = flowstats.lookup(flow);

	if (!st) {
		int zero = 0;
		struct fs_flow_stat *init = zero_stat.lookup(&zero);

		if (!init)
			return 0;
		flowstats.update(flow, init);
		st = flowstats.lookup(flow);
		if (!st)
			return 0;
	}
	struct fs_flow_slot *s = &st->slot[gen & 1];
	if (s->gen != gen) {
		__builtin_memset(s, 0, sizeof(*s));
		s->gen = gen;
		s->rtt_min_us = 0xffffffff;
		s->cwnd_min = 0xffffffff;
		s->ssthresh_min = 0xffffffff;
	}
	return s;
}

/* Report the socket's transfer in progress and end it. Reported: one that moved
 * FS_TRANSFER_MIN_BYTES, and one that began at most FS_TRANSFER_TAIL_NS after the
 * socket's previous reported transfer ended: the rest of a bulk transfer that a
 * stall (a descheduled sender or reader) split, which alone can be small. Others
 * are only counted: chatter between bulk transfers makes no events. */
static __always_inline void end_transfer(struct fs_sock *s, struct fs_flow *flow, __u16 family)
{
	if (!s->xfer_start)
		return;
	__u64 gap = s->xfer_reported_end ? s->xfer_start - s->xfer_reported_end : 0;
	__u64 bytes = s->xfer_in + s->xfer_out;
	int follows = bytes && s->xfer_reported_end && gap <= FS_TRANSFER_TAIL_NS;

	if (bytes >= FS_TRANSFER_MIN_BYTES || follows) {
		struct fs_flow_event ev = {};

		ev.ts_ns = s->xfer_start;
		ev.flow = *flow;
		ev.family = family;
		ev.type = FS_EV_TRANSFER;
		ev.active = s->active;
		ev.pid = s->pid;
		ev.duration_ns = s->xfer_last - s->xfer_start;
		ev.bytes_acked = s->xfer_out;
		ev.bytes_received = s->xfer_in;
		ev.gap_ns = gap;
		if (s->xfer_reported_end)
			ev.flags |= FS_TRANSFER_AFTER_REPORTED;
		s->xfer_reported_end = s->xfer_last;
		fstat_add(FS_FSTAT_TRANSFERS, 1);
		if (bytes < FS_TRANSFER_MIN_BYTES)
			fstat_add(FS_FSTAT_TRANSFERS_TAIL, 1);
		emit_flow(&ev);
	} else {
		fstat_add(FS_FSTAT_TRANSFERS_SMALL, 1);
	}
	s->xfer_start = 0;
	s->xfer_in = 0;
	s->xfer_out = 0;
}

/* Takes `n` bytes off a count, at most what it holds. */
static __always_inline void withdraw(__u64 *count, __u64 n)
{
	*count -= n < *count ? n : *count;
}

/* Received bytes of hits this program missed. The kernel skips a tracepoint program
 * while another tracing program or a BPF map syscall (bpf_disable_instrumentation:
 * user space draining maps, even preempted inside it) holds the CPU's
 * bpf_prog_active, and some hits never reach it uncounted; tcp_probe's data_len then
 * misses those segments (measured: ~1.4 % of the bytes with map syscalls beside the
 * receiver; 1.5 MB of one 2 MiB read). Our ACKs say what arrived: the
 * acknowledgment number of the socket's last packet out (TC egress) advances by
 * every byte received in order. rcv_acked accumulates those advances on
 * `received`'s scale.
 *
 * The scales are tied once, before anything is counted (ack_baseline: nothing is
 * then counted and unacknowledged), and compared at a gap only when that packet
 * left after the last hit that counted payload: the socket is locked from a hit
 * until its segment is processed, so such a packet was built after and
 * acknowledges everything counted but out-of-order data, which, like duplicates,
 * counts before (or beyond) its acknowledgment and can only hide as many missed
 * bytes.
 *
 * `closing`: 1 at close. The peer's FIN may then be acknowledged (it takes one
 * sequence number and carries no byte), and the last ACK is compared whenever it
 * left: no later one will come, and an older one can only hide missed bytes, never
 * add any. A starved receiver's last hit is often a duplicate (the sender's tail
 * loss probe of the segment that carried its FIN): the ACK answering it repeats the
 * number that first left before it, and the bytes missed before would be lost.
 *
 * The other way round, bytes counted that such an ACK does not cover were never
 * received in order: a duplicate (a spurious retransmission, a tail loss probe
 * whose ACK a busy host delayed), a segment dropped after its hit, or out-of-order
 * data beyond a hole. They come off `received` and the transfer's `xfer_in` (*withdrawn:
 * the caller's window slot takes them off too) when the ACK left after
 * the last hit that counted payload; out-of-order bytes come back, recovered,
 * when an ACK covers them. At close the FIN counts as acknowledged when bytes
 * counted exceed the ACK's: a close follows the FIN's ACK but for an abort.
 * Returns the recovered bytes (added to `received` by the caller) and, in *ack_ns,
 * when the ACK that covers them left. */
static __always_inline __u32 recover_received(__u64 sk, struct fs_flow *flow,
					      struct fs_sock *s, __u64 *ack_ns, __u32 closing,
					      __u32 *withdrawn)
{
	__u32 ack;

	*withdrawn = 0;
	if (!s->has_ack || !fs_last_ack(sk, flow, &ack, ack_ns, 0))
		return 0;
	int fresh = *ack_ns > s->last_in_ns;

	if (!closing && !fresh)
		return 0;
	__u32 d = ack - s->last_ack;
	if (d >= 0x80000000)
		return 0;
	s->last_ack = ack;
	s->rcv_acked += d;
	if (s->received > s->rcv_acked) {
		if (!fresh)
			return 0;
		__u64 unacked = s->received + closing - s->rcv_acked;

		if (unacked > s->received)
			unacked = s->received;
		if (unacked > 0xffffffff)
			unacked = 0xffffffff;
		s->received -= unacked;
		withdraw(&s->xfer_in, unacked);
		fstat_add(FS_FSTAT_UNACKED, unacked);
		*withdrawn = unacked;
		return 0;
	}
	if (s->rcv_acked <= s->received + closing)
		return 0;
	__u64 missed = s->rcv_acked - s->received - closing;
	fstat_add(FS_FSTAT_RECOVERED, missed);
	return missed > 0xffffffff ? 0xffffffff : (__u32)missed;
}

/* Whether `recovered` bytes found missed at a transfer's end (recover_received)
 * arrived after it, as the start of the transfer that the hit after the gap begins.
 * Where the socket sent payload since the transfer's last hit (snd_nxt moved: a
 * request on a persistent connection) and that was its last packet out, the ACK
 * that covers them rode on it: they came before our request, so before any reply
 * to it. Else the time that ACK first left decides: within the gap of the
 * transfer's last hit, they were its tail. Timing alone misleads where the ACK
 * waited for the application's read or for a request to ride on: a loaded host
 * delays either past the gap. */
static __always_inline int received_after(__u64 sk, struct fs_sock *s, __u64 ack_ns,
					  __u32 nxt)
{
#if defined(FS_RAW_RETRANSMIT)
	struct fs_sock_tx *tx = socks_tx.lookup(&sk);

	if (tx && nxt != s->xfer_nxt && tx->last_bytes && tx->has_ack)
		return 0;
#endif
	return ack_ns > s->xfer_last + FS_TRANSFER_GAP_NS;
}

/* recover_received compares the socket's ACK numbers from `ack` on, with no byte
 * counted since. */
static __always_inline void tie_acks(struct fs_sock *s, __u32 ack)
{
	s->has_ack = 1;
	s->last_ack = ack;
	s->rcv_acked = 0;
}

/* Ties recover_received's scales while the socket has counted nothing, to the
 * acknowledgment number that acknowledged no data: an accepted socket's SYN-ACK (the
 * latest one of its flow, sent before it was established), a connecting one's
 * handshake ACK (tie_at_handshake, from TC egress). Either covers no byte, so hits
 * missed before the first counted one are recovered too. An entry not yet marked
 * established (its ESTABLISHED hit skipped, its first packet not out yet) is an
 * accepted socket's: a connecting one's handshake ACK marks it at TC egress before
 * any data can arrive. Its flow's latest SYN-ACK is then its own, as no other
 * connection of the same flow can start while it lives. Its own last ACK (since it
 * was established, of its flow: an entry of another flow is a dead socket's at the
 * same address) stands in only where neither was seen, as for a socket older than
 * the probe: it may already cover bytes of missed hits, which are then lost. A
 * socket first seen with bytes counted gets none: its missed hits are not
 * recovered. */
static __always_inline void ack_baseline(__u64 sk, struct fs_flow *flow, struct fs_sock *s)
{
	__u32 ack;
	__u64 ts;

	int synack = !s->active && fs_last_ack(sk, flow, &ack, &ts, 1) &&
		     (!s->est_ns || ts <= s->est_ns);

	if (!synack && !(fs_last_ack(sk, flow, &ack, &ts, 0) && ts >= s->est_ns))
		return;
	tie_acks(s, ack);
}

/* Bytes counted since recover_received last compared, past which add_transfer
 * compares within a transfer: a quarter of the ACK number's space, so a later
 * comparison still finds the advance below 2^31 (see recover_received). */
#define FS_ACK_RESYNC_BYTES (1ULL << 30)

/* Of snd_una's advance from `prev` by `out` seen at the first hit after a gap, the
 * bytes the transfer that ended had sent: those below the sequence number at which
 * TC egress (never skipped) saw data resume after a pause (burst_seq). Bytes above it
 * were sent by the transfer this hit starts, acknowledged in hits the kernel
 * skipped; without them the two transfers' bytes would merge. Where data did not
 * resume past `prev` (burst_seq at or below it: wraps to a large difference), all
 * of it is the ended transfer's: the acknowledgment of its last segments. Without
 * TC egress (tracepoint mode) there is no mark, and all of it is. */
static __always_inline __u32 ended_share(__u64 sk, struct fs_flow *flow, __u32 prev,
					 __u32 out)
{
#if defined(FS_RAW_RETRANSMIT)
	struct fs_sock_tx *tx = socks_tx.lookup(&sk);
	__u32 mine;

	if (!tx || !fs_flow_same(&tx->flow, flow))
		return out;
	mine = tx->burst_seq - prev;
	if (mine < out) {
		fstat_add(FS_FSTAT_SENT_AFTER_GAP, out - mine);
		return mine;
	}
#endif
	return out;
}

/* Transfers: a socket's hits that move bytes (payload in, snd_una advancing, or
 * data in flight to be acknowledged) with no gap over FS_TRANSFER_GAP_NS between
 * them. A gap ends the transfer before the hit (reported here, on the first hit
 * after the gap) and the hit starts the next; a close ends it too. Nothing is sent
 * while bytes flow: one event per transfer.
 *
 * tcp_probe shows the socket as the previous segment left it, so `out` (snd_una's
 * advance) is what the segment before this hit acknowledged: after a gap it is the
 * last acknowledgment of the transfer that ended, and counts there. Bytes of missed
 * hits (recover_received, checked at a gap, once per transfer, and within a long
 * one every FS_ACK_RESYNC_BYTES; not per segment) count for the transfer that ended when they arrived before it ended
 * (received_after: our request's ACK covered them, or our ACK of them left before
 * the gap began); else the hits missed were the beginning of the one this hit
 * starts, and they, with that snd_una advance, count for it. Returns the recovered
 * bytes. */
static __always_inline __u32 add_transfer(__u64 sk, struct fs_sock *s, struct fs_flow *flow,
					  __u16 family, __u32 in, __u32 out, __u32 una, __u32 nxt,
					  __u32 *withdrawn)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 recovered = 0;

	*withdrawn = 0;
	if (s->xfer_start && now - s->xfer_last > FS_TRANSFER_GAP_NS) {
		__u64 ack_ns = 0;

		recovered = recover_received(sk, flow, s, &ack_ns, 0, withdrawn);
		if (recovered && received_after(sk, s, ack_ns, nxt)) {
			in += recovered;     /* and `out`: acknowledged in those hits, likely */
		} else {
			__u32 ended = ended_share(sk, flow, una - out, out);

			s->xfer_in += recovered;
			s->received += recovered;
			s->xfer_out += ended;
			out -= ended;
		}
		end_transfer(s, flow, family);
	} else if (s->has_ack && s->received > s->rcv_acked + FS_ACK_RESYNC_BYTES) {
		/* A transfer with no gap: our ACK numbers wrap every 4 GiB, and a
		 * difference of 2 GiB or more is ambiguous, so compare within the
		 * transfer before either; its missed bytes are its own. */
		__u64 ack_ns = 0;

		recovered = recover_received(sk, flow, s, &ack_ns, 0, withdrawn);
		s->xfer_in += recovered;
		s->received += recovered;
	}
	s->received += in;
	if (in)
		s->last_in_ns = now;
	if (!in && !out && una == nxt)      /* nothing moved, nothing in flight */
		return recovered;
	if (!s->xfer_start)
		s->xfer_start = now;
	s->xfer_last = now;
	s->xfer_nxt = nxt;
	s->xfer_in += in;
	s->xfer_out += out;
	return recovered;
}

/* Where the socket's sent and acknowledged bytes count from, at its first hit (snd_una
 * `una`): the first sequence number of its data that TC egress saw leave, when that
 * is at or below `una`: the bytes between left while we watched and were acknowledged
 * in hits the kernel skipped (see recover_received; a fresh connection's first ACKs
 * of a slow start, measured 7,240 bytes of one). Else `una` itself: a socket older
 * than the agent, whose earlier bytes are not ours to count, or one TC has not seen. */
static __always_inline __u32 una_baseline(__u64 sk, struct fs_flow *flow, __u32 una)
{
#if defined(FS_RAW_RETRANSMIT)
	struct fs_sock_tx *tx = socks_tx.lookup(&sk);

	/* a packet never leaves beyond snd_end, so una <= snd_end for this connection's
	 * entry; a stale one (a freed socket's at this address) rarely passes */
	if (tx && fs_flow_same(&tx->flow, flow) && una - tx->first_seq < 0x80000000 &&
	    tx->snd_end - una < 0x80000000) {
		fstat_add(FS_FSTAT_ACKED_BEFORE_FIRST_HIT, una - tx->first_seq);
		return tx->first_seq;
	}
#endif
	return una;
}

/* snd_una/snd_nxt progress of the socket since its previous hit (returns the bytes
 * newly acknowledged), and its transfer bookkeeping (`in`: payload of this segment;
 * *recovered: received bytes of missed hits found now, *withdrawn: bytes counted
 * that our ACKs did not cover, taken off now; see recover_received). */
static __always_inline __u32 advance(__u64 sk, __u32 una, __u32 nxt, __u32 in,
				     struct fs_flow *flow, __u16 family, __u32 *recovered,
				     __u32 *withdrawn)
{
	struct fs_sock *s = socks.lookup(&sk);

	if (!s) {
		s = new_sock(sk, bpf_ktime_get_ns());
		if (!s)
			return 0;
		ack_baseline(sk, flow, s);
	} else if (!s->has_ack && !s->received) {
		ack_baseline(sk, flow, s);
	}
	if (!s->has_una) {
		/* Both count from the baseline, so bytes in flight then are "sent" too and
		 * sent >= acked holds. */
		__u32 base = una_baseline(sk, flow, una);

		s->last_una = base;
		s->last_nxt = base;
		s->has_una = 1;
	}
	__u32 sent = nxt - s->last_nxt;
	if (sent && sent < 0x80000000) {
		s->sent += sent;
		s->last_nxt = nxt;
	}
	__u32 acked = una - s->last_una;
	if (!acked || acked >= 0x80000000)
		acked = 0;
	else {
		s->acked += acked;
		s->last_una = una;
	}
	*recovered = add_transfer(sk, s, flow, family, in, acked, una, nxt, withdrawn);
	return acked;
}

TRACEPOINT_PROBE(tcp, tcp_probe)
{
	/* aligned: fs_flow_same compares it a word at a time */
	struct fs_flow flow __attribute__((aligned(4))) = {};
	int zero = 0;

	if (!fs_own_sockaddr(&flow, args->saddr, args->daddr))
		return 0;
	__u32 *g = window.lookup(&zero);
	if (!g || *g == 0)
		return 0;        /* user space has not started the first window yet */
	__u32 gen = *g;
	__u32 recovered = 0, withdrawn = 0;
	__u32 acked = advance((__u64)args->skaddr, args->snd_una, args->snd_nxt, args->data_len,
			      &flow, args->family, &recovered, &withdrawn);
	fstat_add(FS_FSTAT_PROBE_HITS, 1);

	struct fs_flow_slot *s = slot_for(&flow, gen);
	if (!s) {
		fstat_add(FS_FSTAT_NO_SLOT, 1);
		return 0;
	}
	s->segs_in++;
	/* this CPU's share of the window: bytes counted on another CPU or in an
	 * earlier window stay there */
	withdraw(&s->received, withdrawn);
	s->received += args->data_len + recovered;
	__u32 cwnd = args->snd_cwnd;
	if (cwnd < s->cwnd_min)
		s->cwnd_min = cwnd;
	if (cwnd > s->cwnd_max)
		s->cwnd_max = cwnd;
	__u32 b = fs_log2(cwnd);
	if (b > FS_CWND_BUCKETS - 1)
		b = FS_CWND_BUCKETS - 1;
	s->cwnd_hist[b]++;
	__u32 ssthresh = args->ssthresh;
	if (ssthresh < FS_SSTHRESH_INFINITE) {
		if (ssthresh < s->ssthresh_min)
			s->ssthresh_min = ssthresh;
		if (ssthresh > s->ssthresh_max)
			s->ssthresh_max = ssthresh;
	}
	if (!acked)
		return 0;
	s->acked += acked;
	__u32 rtt = args->srtt;     /* the tracepoint stores tp->srtt_us >> 3: microseconds */
	s->rtt_samples++;
	s->rtt_sum_us += rtt;
	s->rtt_sumsq_us += (__u64)rtt * rtt;
	if (rtt < s->rtt_min_us)
		s->rtt_min_us = rtt;
	if (rtt > s->rtt_max_us)
		s->rtt_max_us = rtt;
	b = fs_log2(rtt);
	if (b > FS_RTT_BUCKETS - 1)
		b = FS_RTT_BUCKETS - 1;
	s->rtt_hist[b]++;
	fstat_add(FS_FSTAT_RTT_SAMPLES, 1);
	return 0;
}
#endif

#ifdef FS_WITH_SET_STATE
/* The open event of socket sk (its entry s, or none: then one is made, this side
 * connecting as ev->active says): marks it established. ev has the flow, family
 * and states. */
static __always_inline void open_flow(__u64 sk, struct fs_sock *s, struct fs_flow_event *ev,
				      __u64 now)
{
	ev->ts_ns = now;
	ev->type = FS_EV_OPEN;
	if (s) {
		s->est_ns = now;
		ev->active = s->active;
		ev->pid = s->pid;
		if (s->start_ns)
			ev->duration_ns = now - s->start_ns;
	} else {
		s = new_sock(sk, now);
		if (s) {
			s->est_ns = now;
			s->active = ev->active;
		}
	}
	emit_flow(ev);
}

#if defined(FS_WITH_TCP_PROBE) && defined(FS_RAW_RETRANSMIT)
/* At a close whose peer acknowledged our FIN (from FIN_WAIT2, LAST_ACK or CLOSING),
 * every byte TC egress saw us send was acknowledged, also those that no hit counted:
 * tcp_probe shows a socket as the segment before left it, so the last segment's
 * acknowledgment counts at the next hit, and a socket that closes first has none
 * after the peer's answer (a store's acknowledgment of a write, which carries the
 * ACK of its last bytes). They count for the flow, its window and the transfer in
 * progress. Returns the bytes. */
static __always_inline __u32 acked_at_close(__u64 sk, struct fs_sock *s,
					    struct fs_flow_event *ev)
{
	int old = ev->oldstate;
	struct fs_sock_tx *tx;
	int zero = 0;

	if (old != FS_TCP_FIN_WAIT2 && old != FS_TCP_LAST_ACK && old != FS_TCP_CLOSING)
		return 0;
	tx = socks_tx.lookup(&sk);
	if (!tx || !fs_flow_same(&tx->flow, &ev->flow))
		return 0;
	__u32 data_end = tx->snd_end - 1;          /* the FIN takes a sequence number */
	__u32 rest = data_end - s->last_una;

	if (!rest || rest >= 0x80000000)
		return 0;
	s->acked += rest;
	s->last_una = data_end;
	if (tx->snd_end - s->last_nxt < 0x80000000) {
		s->sent += tx->snd_end - s->last_nxt;
		s->last_nxt = tx->snd_end;
	}
	if (s->xfer_start)
		s->xfer_out += rest;
	__u32 *g = window.lookup(&zero);
	if (g && *g) {
		struct fs_flow_slot *slot = slot_for(&ev->flow, *g);

		if (slot)
			slot->acked += rest;
	}
	fstat_add(FS_FSTAT_ACKED_AT_CLOSE, rest);
	return rest;
}
#endif

/* The close event of socket sk (its entry s, or none): the counts, the last
 * transfer; forgets the socket once the event went out. ev has the flow, family and
 * states. A close the ring had no room for (its reader starved) keeps the entry, so
 * that tcp_destroy_sock, or the sweep once the socket is gone, reports it again:
 * a flow's close is its counts, the one record that must not be lost. Returns what
 * emit_flow returned. */
static __always_inline long close_flow(__u64 sk, struct fs_sock *s, struct fs_flow_event *ev,
				       __u64 now)
{
	ev->ts_ns = now;
	ev->type = FS_EV_CLOSE;
	if (s) {
		ev->active = s->active;
		ev->pid = s->pid;
		if (s->est_ns) {
			ev->duration_ns = now - s->est_ns;
			ev->flags |= FS_CLOSE_ESTABLISHED;
		}
		if (s->has_una) {
#ifdef FS_WITH_TCP_PROBE
			/* the last bytes, when their hits were missed */
			__u64 ack_ns;
			__u32 withdrawn;
			__u32 recovered = recover_received(sk, &ev->flow, s, &ack_ns, 1,
							   &withdrawn);

			s->received += recovered;
			if (s->xfer_start)
				s->xfer_in += recovered;
#endif
#if defined(FS_WITH_TCP_PROBE) && defined(FS_RAW_RETRANSMIT)
			acked_at_close(sk, s, ev);
#endif
			ev->bytes_acked = s->acked;
			ev->bytes_sent = s->sent;
			ev->bytes_received = s->received;
			ev->flags |= FS_CLOSE_UNA;
		}
#ifdef FS_WITH_TCP_PROBE
		end_transfer(s, &ev->flow, ev->family);
#endif
	}
	long err = emit_flow(ev);

	if (s && !err)
		socks.delete(&sk);
	return err;
}

#ifdef FS_RAW_RETRANSMIT
static __always_inline long close_unseen(__u64 sk, struct fs_sock *s, __u64 when, int stat);
#endif

TRACEPOINT_PROBE(sock, inet_sock_set_state)
{
	struct fs_flow_event ev = {};
	int newstate = args->newstate, oldstate = args->oldstate;

	if (args->protocol != IPPROTO_TCP || oldstate == FS_TCP_LISTEN)
		return 0;
	if (newstate != FS_TCP_SYN_SENT && newstate != FS_TCP_ESTABLISHED &&
	    newstate != FS_TCP_CLOSE)
		return 0;
	if (!fs_own_flow(&ev.flow, args->saddr_v6, args->daddr_v6, args->saddr, args->daddr))
		return 0;
	fstat_add(FS_FSTAT_STATE_HITS, 1);
	__u64 sk = (__u64)args->skaddr;
	__u64 now = bpf_ktime_get_ns();
	struct fs_sock *s = socks.lookup(&sk);

#ifdef FS_RAW_RETRANSMIT
	/* A socket starts without an entry, but for the one its SYN_SENT made: any
	 * other is a freed socket's whose close no hook saw. */
	if (s && (newstate == FS_TCP_SYN_SENT ||
		  (newstate == FS_TCP_ESTABLISHED &&
		   (s->est_ns || oldstate != FS_TCP_SYN_SENT)))) {
		close_unseen(sk, s, 0, FS_FSTAT_CLOSED_AT_REUSE);
		s = 0;
	}
#endif
	if (newstate == FS_TCP_SYN_SENT) {
		s = new_sock(sk, now);
		if (s) {
			s->start_ns = now;
			s->active = 1;
			s->pid = bpf_get_current_pid_tgid() >> 32;
		}
		return 0;        /* the source port is not chosen yet: report at ESTABLISHED */
	}
	ev.ts_ns = now;
	ev.flow.sport = args->sport;
	ev.flow.dport = args->dport;
	ev.family = args->family;
	ev.oldstate = oldstate;
	ev.state = newstate;
	if (newstate == FS_TCP_ESTABLISHED) {
		ev.active = oldstate == FS_TCP_SYN_SENT;
		open_flow(sk, s, &ev, now);
		return 0;
	}
	close_flow(sk, s, &ev, now);
	return 0;
}

#ifdef FS_RAW_RETRANSMIT
/* The close of socket sk (its entry s) that no inet_sock_set_state hit reported,
 * with the flow TC egress saw it send; the state it closed from is unknown (0).
 * when: the close's time; 0: the socket's last packet out (a socket found freed
 * later closed after that). */
static __always_inline long close_unseen(__u64 sk, struct fs_sock *s, __u64 when, int stat)
{
	struct fs_sock_tx *tx = socks_tx.lookup(&sk);

	if (!tx) {           /* it never sent a packet: nothing to name its flow by */
		socks.delete(&sk);
		return 0;
	}
	struct fs_flow_event ev = {
		.flow = tx->flow,
		.family = tx->family,
		.state = FS_TCP_CLOSE,
	};
	fstat_add(stat, 1);
	return close_flow(sk, s, &ev, when ? when : tx->ts_ns);
}

/* Called by tcp_retransmit.bpf.c's raw tcp_destroy_sock before it forgets the
 * socket: every full socket reaches CLOSE before it is destroyed, and that hit
 * deletes the socket's entry, so an entry left here is a close the kernel skipped
 * (a tracepoint program does not run while a BPF map syscall holds the CPU) or one
 * the ring had no room for. Nonzero: keep the entries (the sweep reports the close
 * once the socket is gone). */
static __always_inline int close_at_destroy(__u64 sk)
{
	struct fs_sock *s = socks.lookup(&sk);
	int zero = 0;
	struct fs_sweep *sweep = sweeping.lookup(&zero);

	if (sweep && sweep->sk == sk) {
		/* the sweep's replay: only for the socket it found gone, not a newer one
		 * at the same address, whose entries then stay too */
		if (!s || s->cookie != sweep->cookie)
			return 1;
		/* a close the ring could not take keeps the entries for the next sweep */
		return close_unseen(sk, s, 0, FS_FSTAT_CLOSED_AT_SWEEP) != 0;
	}
	if (s)
		return close_unseen(sk, s, bpf_ktime_get_ns(), FS_FSTAT_CLOSED_AT_DESTROY) != 0;
	return 0;
}

/* TC egress, a connected socket's packet that may be its first with an entry here
 * (the first after the handshake, or its first at all). */
static __always_inline void keep_cookie(__u64 sk, struct __sk_buff *skb)
{
	struct fs_sock *s = socks.lookup(&sk);

	if (s && !s->cookie)
		s->cookie = bpf_get_socket_cookie(skb);
}

/* Called by TC egress with a connecting socket's handshake ACK (ack: the peer's
 * initial sequence number + 1), which leaves before any data can arrive: the baseline
 * of recover_received (see ack_baseline) when the socket has counted nothing. */
static __always_inline void tie_at_handshake(__u64 sk, __u32 ack)
{
	struct fs_sock *s = socks.lookup(&sk);

	if (!s || s->has_ack || s->received)
		return;
	tie_acks(s, ack);
}

/* Called by TC egress when a new socket's packet finds a freed socket's entry at
 * its address (last_tx_ns: that socket's last packet): the kernel skipped the
 * freed socket's CLOSE and tcp_destroy_sock hits alike (seen on 6.18 in softirq,
 * mostly without counting a miss). An entry made after that packet is the new
 * socket's own (its SYN_SENT or ESTABLISHED hit came first). */
static __always_inline void close_at_reuse(__u64 sk, __u64 last_tx_ns)
{
	struct fs_sock *s = socks.lookup(&sk);

	if (s && s->made_ns <= last_tx_ns)
		close_unseen(sk, s, 0, FS_FSTAT_CLOSED_AT_REUSE);
}

/* Called by TC egress with a socket's first acknowledging packet after its SYN
 * (active) or its first packet at all (passive). Either follows the socket's
 * ESTABLISHED, whose hit sets est_ns; without it the hit was skipped, and the
 * open is reported now, at the packet. A passive one only when its SYN-ACK passed
 * TC egress (synacks): other sockets seen for the first time are older than the
 * probe. The state before is known by construction. */
static __always_inline void open_at_first_ack(__u64 sk, const void *flow_ptr, __u16 family,
					      __u8 active, __u64 now)
{
	const struct fs_flow *flow = flow_ptr;   /* declared before fs_flow was */
	struct fs_sock *s = socks.lookup(&sk);

	if (s && s->est_ns)
		return;
	if (!active && !synacks.lookup((struct fs_flow *)flow))
		return;
	int zero = 0;
	struct fs_flow_event *ev = tc_event.lookup(&zero);

	if (!ev)
		return;
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->flow = *flow;
	ev->family = family;
	ev->active = active;
	ev->oldstate = active ? FS_TCP_SYN_SENT : FS_TCP_SYN_RECV;
	ev->state = FS_TCP_ESTABLISHED;
	fstat_add(FS_FSTAT_OPENED_AT_FIRST_ACK, 1);
	open_flow(sk, s, ev, now);
}
#endif /* FS_RAW_RETRANSMIT */
#endif

#ifdef FS_WITH_SEND_RESET
TRACEPOINT_PROBE(tcp, tcp_send_reset)
{
	struct fs_flow_event ev = {};

	/* Without a full socket the kernel stores the incoming packet's 4-tuple
	 * reversed, so saddr is this side either way. */
	if (!fs_own_sockaddr(&ev.flow, args->saddr, args->daddr))
		return 0;
	ev.ts_ns = bpf_ktime_get_ns();
	ev.type = FS_EV_RST_SENT;
	ev.state = args->state;
#ifdef FS_TP_RST_REASON
	ev.reason = args->reason;
#else
	ev.reason = FS_RST_REASON_NONE;
#endif
	emit_flow(&ev);
	return 0;
}
#endif

#ifdef FS_WITH_RECV_RESET
TRACEPOINT_PROBE(tcp, tcp_receive_reset)
{
	struct fs_flow_event ev = {};

	if (!fs_own_flow(&ev.flow, args->saddr_v6, args->daddr_v6, args->saddr, args->daddr))
		return 0;
	ev.ts_ns = bpf_ktime_get_ns();
	ev.flow.sport = args->sport;
	ev.flow.dport = args->dport;
	ev.family = args->family;
	ev.type = FS_EV_RST_RECV;
	emit_flow(&ev);
	return 0;
}
#endif
