// SPDX-License-Identifier: Apache-2.0
/* tcp_retransmit: one event per TCP retransmission sent from this node's addresses,
 * with its kind (fast retransmit, RTO, slow start after RTO, tail loss probe).
 *
 * Hooks (stable ABI only; no kernel struct is read), with -DFS_RAW_RETRANSMIT:
 *   TC egress (cls_bpf, direct action)    every own TCP packet: node totals of skbs,
 *       segments (gso_segs) and payload; per socket (skb->sk) the highest sequence
 *       number sent, so that a packet starting below it is a retransmission: the
 *       event, with its segments and payload
 *   raw tracepoint tcp_retransmit_skb     (sk, skb, err): the attempts that sent no
 *       packet (err < 0) and those the qdisc dropped after TC counted them (err > 0)
 *   raw tracepoint tcp_cong_state_set     congestion state per socket: the kind
 *   raw tracepoint tcp_destroy_sock       forgets a socket (a socket whose teardown
 *       it missed is forgotten when TC egress sees another flow under its address)
 *   tracepoint tcp/tcp_retransmit_synack  SYN-ACK retransmits (RetransSegs counts them),
 *       unless TC egress keeps each flow's last SYN-ACK (FS_REMEMBER_SYNACK, set by
 *       tcp_flows): then a SYN-ACK that acknowledges the same SYN as the flow's last
 *       one is the retransmit, found where it leaves, as a SYN's is
 * Without raw tracepoints (before 4.17) the tracepoints of the same names do it
 * all, each retransmit taking its segments from the flow's last egress packet.
 *
 * Why TC egress: the kernel's RetransSegs adds tcp_skb_pcount(skb) per retransmit,
 * and with TSO/GSO one retransmitted skb carries several segments, which only the
 * packet shows (__sk_buff.gso_segs). And a TC program always runs, while the kernel
 * skips a tracepoint program whenever another tracing program or a BPF map syscall
 * holds the CPU (agent/bpf.py: ProgStats), sometimes without counting the miss.
 * What tcp_retransmit_skb sends is the only own packet that consumes sequence space
 * (payload, SYN or FIN) and starts below the highest sequence sent: new data, a
 * loss probe's included, starts at snd_nxt; keepalives and window probes carry no
 * payload. A SYN is a retransmit when it repeats the socket's initial sequence
 * number. Raw tracepoints are skipped less often, but not never: on 6.18 a whole
 * socket's teardown hits went unseen now and then, counted nowhere (tcp_flows
 * recovers those closes on TC egress and by its sweep).
 * A packet that passes two hooked interfaces (stacked devices that both hold node
 * addresses, e.g. a VLAN device and its parent) is counted where it passed first.
 * TC egress also adds every own TCP packet's segments and payload bytes to node
 * totals (the denominator of the retransmit ratio).
 *
 * Kinds: tcp_set_ca_state() fires tcp_cong_state_set on every change, and the
 * RTO timer calls tcp_enter_loss() (-> Loss, even when already in Loss) right
 * before it retransmits the head; so the first retransmit after a change to Loss
 * is the timeout's, later ones in Loss are slow-start retransmits, those in
 * Recovery fast retransmits, and those in Open/Disorder/CWR tail loss probes
 * (the agent names them; see agent/probes/tcp/retransmit.py for the limits).
 *
 * Options (cflags): -DMAX_ADDRS=n -DFLOW_ENTRIES=n -DRINGBUF_PAGES=n; the loader adds
 * -DFS_TP_HAS_ERR when tcp_retransmit_skb has `err` (6.x; before, only sent skbs
 * were traced), -DFS_TP_SYNACK, -DFS_TP_CONG_STATE and -DFS_TP_DESTROY when those
 * tracepoints exist.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/pkt_cls.h>
#include "tcp_retransmit.h"
#ifndef FS_STATS_SLOTS
#define FS_STATS_SLOTS FS_NSTATS
#endif
#include "fs_common.h"

#ifndef FLOW_ENTRIES
#define FLOW_ENTRIES 16384
#endif
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 16
#endif

#define FS_CA_LOSS 4
#define FS_TCP_FIN 0x01
#define FS_TCP_SYN 0x02
#define FS_TCP_RST 0x04
#define FS_TCP_ACK 0x10
/* The same packet passing a second hooked interface (a VLAN device, then its
 * parent) does so within the one transmit call. */
#define FS_SAME_PACKET_NS 1000000ULL
#ifndef FS_SEND_PAUSE_NS
#define FS_SEND_PAUSE_NS 2000000ULL
#endif

#ifdef FS_RAW_RETRANSMIT
BPF_TABLE("lru_hash", __u64, struct fs_sock_tx, socks_tx, FLOW_ENTRIES);
BPF_PERCPU_ARRAY(tx_scratch, struct fs_sock_tx, 1);
#ifdef FS_REMEMBER_SYNACK
/* The last SYN-ACK per flow (tcp_flows: an accepted socket's first acknowledgment
 * number; the SYN-ACK leaves with the request socket, not the socket it becomes). */
BPF_TABLE("lru_hash", struct fs_flow, struct fs_egress, synacks, FLOW_ENTRIES / 4);
#endif
#else
BPF_TABLE("lru_hash", struct fs_flow, struct fs_egress, egress, FLOW_ENTRIES);
#endif
BPF_TABLE("lru_hash", __u64, struct fs_cong, cong, FLOW_ENTRIES);
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);
/* Never written: exposes the event layout to the loader's size check. */
BPF_ARRAY(event_layout, struct fs_retransmit_event, 1);

static __always_inline void emit(struct fs_retransmit_event *ev)
{
	fs_count_emit(events.ringbuf_output(ev, sizeof(*ev), 0), FS_STAT_EMITTED, FS_STAT_LOST);
}

/* The socket's congestion state into the event; consumes the timeout mark. */
static __always_inline void take_cong(struct fs_retransmit_event *ev, __u64 sk)
{
#ifdef FS_TP_CONG_STATE
	struct fs_cong *c = cong.lookup(&sk);

	if (!c)
		return;          /* no change seen since the socket began: Open (0) */
	ev->ca_state = c->ca_state;
	if (c->timeout) {
		ev->timeout = 1;
		c->timeout = 0;
	}
#else
	ev->ca_state = FS_CA_UNKNOWN;
#endif
}

#ifdef FS_RAW_RETRANSMIT
/* Raw tracepoint: args (const struct sock *sk, const struct sk_buff *skb, int err);
 * only the values are used (sk as an opaque key, err), no struct is read. A sent
 * retransmit (err 0) is TC egress's event; this one reports those that sent no
 * packet (err < 0: the kernel retries later, or the transmit failed) with the flow
 * TC egress last saw on the socket, and counts those the qdisc dropped after TC
 * (err > 0). Kernels before the err argument trace sent skbs only. */
RAW_TRACEPOINT_PROBE(tcp_retransmit_skb)
{
	__u64 sk = ctx->args[0];
	__s32 err = 0;

	stat_add(FS_STAT_HITS, 1);
#ifdef FS_TP_HAS_ERR
	err = (__s32)ctx->args[2];
#endif
	if (err == 0)
		return 0;
	struct fs_sock_tx *tx = socks_tx.lookup(&sk);
	if (!tx)
		return 0;        /* not one of our sockets (no own packet left through TC) */
	if (err > 0) {
		stat_add(FS_STAT_QDISC_DROPPED, 1);
		return 0;
	}
	struct fs_retransmit_event ev = {
		.ts_ns = bpf_ktime_get_ns(),
		.flow = tx->flow,
		.family = tx->family,
		.state = tx->state,
		.err = err,
		.hook = FS_HOOK_SKB,
	};
	take_cong(&ev, sk);
	emit(&ev);
	return 0;
}
#endif

#ifndef FS_RAW_RETRANSMIT
TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)
{
	struct fs_retransmit_event ev = {};

#ifdef FS_TP_HAS_ERR
	ev.err = args->err;
#endif
	stat_add(FS_STAT_HITS, 1);
	if (!fs_own_flow(&ev.flow, args->saddr_v6, args->daddr_v6, args->saddr, args->daddr))
		return 0;
	ev.ts_ns = bpf_ktime_get_ns();
	ev.flow.sport = args->sport;
	ev.flow.dport = args->dport;
	ev.family = args->family;
	ev.state = args->state;
	ev.hook = FS_HOOK_SKB;
	take_cong(&ev, (__u64)args->skaddr);
	/* err 0: sent; err > 0: NET_XMIT_DROP from the qdisc, which runs after TC
	 * egress. Both passed TC, so the flow's last egress packet is this one. */
	if (ev.err >= 0) {
		struct fs_egress *seen = egress.lookup(&ev.flow);
		if (seen) {
			ev.segs = seen->gso_segs;
			ev.bytes = seen->bytes;
			egress.delete(&ev.flow);
		} else {
			stat_add(FS_STAT_SEGS_UNKNOWN, 1);
		}
	}
	emit(&ev);
	return 0;
}
#endif /* !FS_RAW_RETRANSMIT */

/* A SYN-ACK resent: one segment, the request socket's (SYN_RECV), filed as a
 * timeout's (the request socket's timer resends it). */
static __always_inline void synack_retransmit(struct fs_retransmit_event *ev)
{
	ev->state = FS_TCP_SYN_RECV;
	ev->segs = 1;
	ev->hook = FS_HOOK_SYNACK;
	ev->ca_state = FS_CA_LOSS;
	ev->timeout = 1;
}

#if defined(FS_RAW_RETRANSMIT) && defined(FS_REMEMBER_SYNACK)
#define FS_SYNACK_ON_TC 1      /* tc_egress finds them: the tracepoint is not compiled */
#endif

#ifdef FS_SYNACK_ON_TC
/* Built in a per-CPU slot: tc_egress has no stack left for an event. */
BPF_PERCPU_ARRAY(synack_event, struct fs_retransmit_event, 1);

static __always_inline void emit_synack_on_tc(const struct fs_flow *flow, __u64 ts,
					      __u16 family)
{
	int zero = 0;
	struct fs_retransmit_event *ev = synack_event.lookup(&zero);

	if (!ev)
		return;
	ev->ts_ns = ts;
	__builtin_memcpy(&ev->flow, flow, sizeof(ev->flow));
	ev->family = family;
	synack_retransmit(ev);     /* every other field stays 0, as the slot began */
	stat_add(FS_STAT_TC_RETRANSMITS, 1);
	emit(ev);
}
#endif

#if defined(FS_RAW_RETRANSMIT) && defined(FS_REMEMBER_SYNACK)
/* A SYN-ACK on TC egress: the flow's last one is remembered, and the same SYN
 * acknowledged again is the kernel resending it (a new connection on the flow's
 * ports acknowledges another initial sequence). Not exact under SYN cookies: the
 * answer to a resent SYN is then a new SYN-ACK, counted here, not by the kernel. */
static __always_inline void synack_left(struct fs_flow *flow, struct fs_egress *seen,
					__u16 family)
{
#ifdef FS_SYNACK_ON_TC
	struct fs_egress *last = synacks.lookup(flow);

	if (last && last->ack_seq == seen->ack_seq)
		emit_synack_on_tc(flow, seen->ts_ns, family);
#endif
	synacks.update(flow, seen);
}
#endif

#if defined(FS_TP_SYNACK) && !defined(FS_SYNACK_ON_TC)
TRACEPOINT_PROBE(tcp, tcp_retransmit_synack)
{
	struct fs_retransmit_event ev = {};

	stat_add(FS_STAT_HITS, 1);
	if (!fs_own_flow(&ev.flow, args->saddr_v6, args->daddr_v6, args->saddr, args->daddr))
		return 0;
	ev.ts_ns = bpf_ktime_get_ns();
	ev.flow.sport = args->sport;
	ev.flow.dport = args->dport;
	ev.family = args->family;
	synack_retransmit(&ev);
	emit(&ev);
	return 0;
}
#endif

#if defined(FS_TP_CONG_STATE) && defined(FS_RAW_RETRANSMIT)
/* Raw: args (struct sock *sk, u8 ca_state). Own sockets are those TC egress saw
 * (a socket sends before its congestion state can change). */
RAW_TRACEPOINT_PROBE(tcp_cong_state_set)
{
	__u64 sk = ctx->args[0];
	__u8 ca_state = (__u8)ctx->args[1];

	if (!socks_tx.lookup(&sk))
		return 0;
	struct fs_cong c = {
		.ca_state = ca_state,
		.timeout = ca_state == FS_CA_LOSS,
	};
	cong.update(&sk, &c);
	stat_add(FS_STAT_CONG_SET, 1);
	return 0;
}
#elif defined(FS_TP_CONG_STATE)
TRACEPOINT_PROBE(tcp, tcp_cong_state_set)
{
	struct fs_flow flow = {};
	__u64 sk = (__u64)args->skaddr;

	if (!fs_own_flow(&flow, args->saddr_v6, args->daddr_v6, args->saddr, args->daddr))
		return 0;
	struct fs_cong c = {
		.ca_state = args->cong_state,
		.timeout = args->cong_state == FS_CA_LOSS,
	};
	cong.update(&sk, &c);
	stat_add(FS_STAT_CONG_SET, 1);
	return 0;
}
#endif

/* A freed socket's address is reused by the next one (maybe another node's),
 * which starts in Open. */
#if defined(FS_RAW_RETRANSMIT) && defined(FS_TP_DESTROY)
RAW_TRACEPOINT_PROBE(tcp_destroy_sock)
{
	__u64 sk = ctx->args[0];

#ifdef FS_ON_DESTROY
	if (FS_ON_DESTROY(sk))   /* an includer's teardown work, before the entry goes; */
		return 0;        /* nonzero: not this socket's teardown, keep the entries */
#endif
	cong.delete(&sk);
	socks_tx.delete(&sk);
	return 0;
}
#elif defined(FS_TP_CONG_STATE) && defined(FS_TP_DESTROY)
TRACEPOINT_PROBE(tcp, tcp_destroy_sock)
{
	__u64 sk = (__u64)args->skaddr;

	cong.delete(&sk);
	return 0;
}
#endif

#ifdef FS_RAW_RETRANSMIT
static __always_inline int fs_flow_same(const struct fs_flow *a, const struct fs_flow *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;
	__u32 diff = 0;

#pragma unroll
	for (int i = 0; i < sizeof(struct fs_flow) / 4; i++)
		diff |= x[i] ^ y[i];
	return diff == 0;
}

/* Another connection's flow than the entry's: the ports or the peer differ (the
 * cheap test every packet pays; fs_flow_same is the full one). */
static __always_inline int fs_other_flow(const struct fs_flow *a, const struct fs_flow *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;

	/* words 7 and 8: the peer address's last 4 bytes (all of IPv4), both ports */
	return (x[7] ^ y[7]) | (x[8] ^ y[8]);
}

/* A retransmitted packet of the socket TC egress just saw (see the top comment). */
static __always_inline void emit_tc_retransmit(__u64 sk, struct fs_flow *flow,
					       struct fs_egress *seen, __u16 family, __u8 state)
{
	struct fs_retransmit_event ev = {
		.ts_ns = seen->ts_ns,
		.flow = *flow,
		.family = family,
		.segs = seen->gso_segs,
		.state = state,
		.hook = FS_HOOK_SKB,
		.bytes = seen->bytes,
	};

	take_cong(&ev, sk);
	stat_add(FS_STAT_TC_RETRANSMITS, 1);
	emit(&ev);
}

#ifdef FS_ON_OPEN_TX
/* A connection's own socket past its handshake (ESTABLISHED, FIN_WAIT1/2,
 * CLOSE_WAIT, LAST_ACK, CLOSING), from the socket fields the BPF ABI gives TC;
 * not the per-CPU control socket that sends resets and TIME_WAIT's ACKs, not a
 * TIME_WAIT or request socket. */
static __always_inline int fs_connected(struct bpf_sock *bsk)
{
	__u32 state = bsk->state;

	return state == FS_TCP_ESTABLISHED || state == FS_TCP_FIN_WAIT1 ||
	       state == FS_TCP_FIN_WAIT2 || state == FS_TCP_CLOSE_WAIT ||
	       state == FS_TCP_LAST_ACK || state == FS_TCP_CLOSING;
}
#endif

/* Follow the socket (key: its address, which the raw tracepoints get as sk; the
 * kernel sets skb->sk on every skb TCP sends) and report the packet when it is a
 * retransmission. Returns 1 when this is the last packet again, on its way through
 * a second hooked interface (stacked devices that both hold node addresses): it is
 * neither counted nor remembered twice. The TCP flags give the state reported: a
 * SYN without ACK is SYN_SENT, anything else ESTABLISHED. SYN-ACKs leave with
 * request sockets and are the synack tracepoint's; RSTs and segments without
 * payload are never retransmissions. */
static __always_inline int remember_tx(struct __sk_buff *skb, struct fs_flow *flow,
				       struct fs_egress *seen, __u8 flags, __u16 proto, __u32 seq)
{
	struct bpf_sock *bsk = skb->sk;

	if (!bsk)
		return 0;
	__u64 sk = (__u64)(long)bsk;
	__u8 syn_sent = (flags & (FS_TCP_SYN | FS_TCP_ACK)) == FS_TCP_SYN;
	__u32 end = seq + seen->bytes + ((flags & FS_TCP_SYN) != 0) + ((flags & FS_TCP_FIN) != 0);
	/* built in per-CPU scratch, not on the stack: tc_egress is near its 512 bytes */
	int zero = 0;
	struct fs_sock_tx *tx = tx_scratch.lookup(&zero);

	if (!tx)
		return 0;
	tx->ts_ns = seen->ts_ns;
	tx->flow = *flow;
	tx->family = proto == bpf_htons(ETH_P_IP) ? FS_AF_INET : FS_AF_INET6;
	tx->state = syn_sent ? FS_TCP_SYN_SENT : FS_TCP_ESTABLISHED;
	tx->last_flags = flags;
	tx->snd_end = end;
	tx->last_seq = seq;
	tx->ack_seq = seen->ack_seq;
	tx->has_ack = seen->has_ack;
	tx->ifindex = skb->ifindex;
	tx->last_bytes = seen->bytes;
	tx->ack_ns = seen->ts_ns;
	/* a SYN takes its sequence number: data starts after it */
	tx->first_seq = seq + ((flags & FS_TCP_SYN) != 0);
	tx->burst_seq = seq;
	struct fs_sock_tx *old = socks_tx.lookup(&sk);

	if (old && fs_other_flow(&old->flow, flow))
		goto stale;
	if (old) {
		if (old->ifindex != tx->ifindex && old->last_seq == seq &&
		    old->last_bytes == seen->bytes && old->last_flags == flags &&
		    seen->ts_ns - old->ts_ns < FS_SAME_PACKET_NS)
			return 1;
		/* new data after a pause resumes the socket's sending; a resent or empty
		 * packet leaves the mark as it was */
		if (!seen->bytes || (__s32)(seq - old->snd_end) < 0 ||
		    tx->ts_ns - old->ts_ns <= FS_SEND_PAUSE_NS)
			tx->burst_seq = old->burst_seq;
		/* The rare packets only (a SYN, or one starting below the highest sequence
		 * sent) need the entry's history, and so the full check that it is this
		 * flow's (the cheap one above compares ports and peer). */
		int below = (__s32)(seq - old->snd_end) < 0;

		if (syn_sent || below) {
			if (!fs_flow_same(&old->flow, flow))
				goto stale;
			int sequenced = end != seq && !(flags & FS_TCP_RST) &&
					(flags & (FS_TCP_SYN | FS_TCP_ACK)) != (FS_TCP_SYN | FS_TCP_ACK);
			/* a SYN with another initial sequence number is a new connection */
			if (sequenced && (syn_sent ? old->snd_end == end : below))
				emit_tc_retransmit(sk, flow, seen, tx->family, tx->state);
			if (!syn_sent && (__s32)(end - old->snd_end) < 0)
				tx->snd_end = old->snd_end;
		}
		if (!seen->has_ack) {            /* a packet without ACK keeps the last one */
			tx->ack_seq = old->ack_seq;
			tx->has_ack = old->has_ack;
		}
		if (old->has_ack && old->ack_seq == tx->ack_seq)
			tx->ack_ns = old->ack_ns;
		/* A connection never sends beyond the highest sequence number it sent: a
		 * packet past it, or a SYN, starts a new connection at this address. */
		if (!syn_sent && (__s32)(seq - old->snd_end) <= 0)
			tx->first_seq = old->first_seq;
#ifdef FS_ON_OPEN_TX
		/* the first packet after our SYN that acknowledges: we connected */
		if (old->state == FS_TCP_SYN_SENT && !syn_sent && (flags & FS_TCP_ACK) &&
		    !(flags & FS_TCP_RST) &&
		    fs_connected(bsk)) {
			FS_ON_OPEN_TX(sk, flow, tx->family, 1, seen->ts_ns);
			FS_ON_CONNECTED_TX(sk, skb);
#ifdef FS_ON_HANDSHAKE_ACK
			FS_ON_HANDSHAKE_ACK(sk, seen->ack_seq);
#endif
		}
#endif
		/* In place: an LRU update allocates a new element per packet, and that churn
		 * can evict other live sockets' entries. */
		*old = *tx;
		return 0;
	}
	socks_tx.update(&sk, tx);
	goto first_packet;
stale:
	/* A freed socket's entry, whose address this socket reuses: no hook saw that
	 * socket's teardown (its tcp_destroy_sock hit would have removed it; request and
	 * TIME_WAIT sockets, which never reach that hook, leave such entries too). This
	 * is a new socket. */
#ifdef FS_ON_STALE
	FS_ON_STALE(sk, old->ts_ns);   /* an includer's teardown work, as at destroy */
#endif
	*old = *tx;
first_packet:
#ifdef FS_ON_OPEN_TX
	/* a socket's first packet, not a handshake's: maybe one we accepted */
	if ((flags & (FS_TCP_SYN | FS_TCP_ACK | FS_TCP_RST)) == FS_TCP_ACK && fs_connected(bsk))
		FS_ON_OPEN_TX(sk, flow, tx->family, 0, seen->ts_ns);
	FS_ON_CONNECTED_TX(sk, skb);
#endif
	return 0;
}
#endif

/* The acknowledgment number of the last own packet of a socket seen on TC egress
 * (the socket's rcv_nxt when it left) and when that number first left (raw mode;
 * else when the packet left); with `synack`, of the flow's last SYN-ACK. 0: TC saw none with ACK. tcp_flows counts received bytes
 * from it when its tcp_probe program missed hits. */
static __always_inline int fs_last_ack(__u64 sk, struct fs_flow *flow, __u32 *ack, __u64 *ts,
				       int synack)
{
#ifdef FS_RAW_RETRANSMIT
#ifdef FS_REMEMBER_SYNACK
	if (synack) {
		struct fs_egress *sa = synacks.lookup(flow);
		if (!sa)
			return 0;
		*ack = sa->ack_seq;
		*ts = sa->ts_ns;
		return 1;
	}
#endif
	struct fs_sock_tx *tx = socks_tx.lookup(&sk);

	/* of another flow: a dead socket's at this address, whose teardown no hook saw */
	if (!tx || !tx->has_ack || fs_other_flow(&tx->flow, flow))
		return 0;
	*ack = tx->ack_seq;
	*ts = tx->ack_ns;
	return 1;
#else
	struct fs_egress *tx = egress.lookup(flow);

	if (!tx || !tx->has_ack)
		return 0;
	*ack = tx->ack_seq;
	*ts = tx->ts_ns;
	return 1;
#endif
}

/* TC egress, direct action: add each own TCP packet's segments and payload to the
 * node totals; raw mode: follow its socket and report it when it is a retransmission;
 * tracepoint mode: keep it as the flow's last packet for the tracepoint.
 * Returns TC_ACT_UNSPEC (not OK) so filters of other tools behind ours still run. */
int tc_egress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	/* aligned: fs_flow_same compares it a word at a time */
	struct fs_flow flow __attribute__((aligned(4))) = {};
	__u8 *l4;

	if ((void *)(eth + 1) > data_end)
		return TC_ACT_UNSPEC;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > data_end || ip->protocol != IPPROTO_TCP)
			return TC_ACT_UNSPEC;
		fs_v4_mapped(&flow.saddr, &ip->saddr);
		fs_v4_mapped(&flow.daddr, &ip->daddr);
		l4 = (__u8 *)ip + ((ip->ihl & 0xf) << 2);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end || ip6->nexthdr != IPPROTO_TCP)
			return TC_ACT_UNSPEC;
		__builtin_memcpy(flow.saddr.a, &ip6->saddr, 16);
		__builtin_memcpy(flow.daddr.a, &ip6->daddr, 16);
		l4 = (__u8 *)(ip6 + 1);
	} else {
		return TC_ACT_UNSPEC;
	}
	if ((void *)(l4 + 14) > data_end)     /* through the flags byte */
		return TC_ACT_UNSPEC;
	if (!own_addrs.lookup(&flow.saddr))
		return TC_ACT_UNSPEC;
	flow.sport = ((__u16)l4[0] << 8) | l4[1];
	flow.dport = ((__u16)l4[2] << 8) | l4[3];

	/* skb->len counts the L2 header at TC egress; a GSO skb has one header set. */
	__u32 headers = (__u32)(l4 - (__u8 *)data) + ((l4[12] >> 4) << 2);
	struct fs_egress seen = {
		.ts_ns = bpf_ktime_get_ns(),
		.gso_segs = skb->gso_segs ? skb->gso_segs : 1,
		.bytes = skb->len > headers ? skb->len - headers : 0,
		.ack_seq = ((__u32)l4[8] << 24) | ((__u32)l4[9] << 16) | ((__u32)l4[10] << 8) | l4[11],
		.has_ack = (l4[13] & 0x10) != 0,
	};
#ifdef FS_RAW_RETRANSMIT
	if (remember_tx(skb, &flow, &seen, l4[13], eth->h_proto,
			((__u32)l4[4] << 24) | ((__u32)l4[5] << 16) | ((__u32)l4[6] << 8) | l4[7]))
		return TC_ACT_UNSPEC;    /* counted on the interface it passed first */
#ifdef FS_REMEMBER_SYNACK
	if ((l4[13] & 0x12) == 0x12)
		synack_left(&flow, &seen, eth->h_proto == bpf_htons(ETH_P_IP) ? FS_AF_INET
									       : FS_AF_INET6);
#endif
#else
	if (!seen.has_ack) {
		struct fs_egress *old = egress.lookup(&flow);
		if (old) {
			seen.ack_seq = old->ack_seq;
			seen.has_ack = old->has_ack;
		}
	}
	egress.update(&flow, &seen);
#endif
	stat_add(FS_STAT_TC_PACKETS, 1);
	stat_add(FS_STAT_TC_SEGS, seen.gso_segs);
	stat_add(FS_STAT_TC_BYTES, seen.bytes);
	return TC_ACT_UNSPEC;
}
