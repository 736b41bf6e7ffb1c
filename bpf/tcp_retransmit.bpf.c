// SPDX-License-Identifier: Apache-2.0
/* tcp_retransmit: one event per TCP retransmission sent from this node's addresses.
 *
 * Hooks (stable ABI only; no kernel struct is read):
 *   tracepoint tcp/tcp_retransmit_skb     one hit per retransmitted skb (with err)
 *   tracepoint tcp/tcp_retransmit_synack  SYN-ACK retransmits (RetransSegs counts them)
 *   TC egress (cls_bpf, direct action)    gso_segs of each own TCP packet
 *
 * Why TC egress: the kernel's RetransSegs adds tcp_skb_pcount(skb) per retransmit,
 * and with TSO/GSO one retransmitted skb carries several segments; the tracepoint
 * has no segment count. tcp_retransmit_skb transmits a clone of the skb through
 * ip_output -> dev_queue_xmit -> TC egress synchronously, under the socket lock,
 * before the tracepoint fires; so the last egress packet of the flow is the
 * retransmitted one and its __sk_buff.gso_segs is the pcount. The tracepoint
 * consumes (deletes) that entry. When TC did not see it, segs is 0 and counted.
 *
 * Attribution: the tracepoints carry no network namespace and one kernel serves
 * every lab node, so events are kept only when the source address is in
 * `own_addrs` (filled by the agent with its node's addresses, v4 as v4-mapped).
 *
 * Options (cflags): -DMAX_ADDRS=n -DFLOW_ENTRIES=n -DRINGBUF_PAGES=n; the loader adds
 * -DFS_TP_HAS_ERR when tcp_retransmit_skb has `err` (6.x; before, only sent skbs
 * were traced) and -DFS_TP_SYNACK when tcp_retransmit_synack exists.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/pkt_cls.h>
#include "tcp_retransmit.h"

#ifndef MAX_ADDRS
#define MAX_ADDRS 64
#endif
#ifndef FLOW_ENTRIES
#define FLOW_ENTRIES 16384
#endif
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 16
#endif

BPF_HASH(own_addrs, struct fs_addr, __u8, MAX_ADDRS);
BPF_TABLE("lru_hash", struct fs_flow, struct fs_egress, egress, FLOW_ENTRIES);
BPF_PERCPU_ARRAY(stats, __u64, FS_NSTATS);
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);
/* Never written: exposes the event layout to the loader's size check. */
BPF_ARRAY(event_layout, struct fs_retransmit_event, 1);

static __always_inline void stat_add(int idx, __u64 n)
{
	__u64 *v = stats.lookup(&idx);
	if (v)
		*v += n;
}

static __always_inline void v4_mapped(struct fs_addr *dst, const void *v4)
{
	__builtin_memset(dst, 0, sizeof(*dst));
	dst->a[10] = 0xff;
	dst->a[11] = 0xff;
	__builtin_memcpy(&dst->a[12], v4, 4);
}

/* Fill flow addresses from the tracepoint fields; 1 when the source is ours.
 * The v6 fields hold v4-mapped addresses for AF_INET sockets; the v4 fields are
 * the fallback for v4 traffic on dual-stack sockets. */
static __always_inline int own_flow(struct fs_flow *flow, const __u8 *s6, const __u8 *d6,
				    const __u8 *s4, const __u8 *d4)
{
	__builtin_memcpy(flow->saddr.a, s6, 16);
	__builtin_memcpy(flow->daddr.a, d6, 16);
	if (own_addrs.lookup(&flow->saddr))
		return 1;
	v4_mapped(&flow->saddr, s4);
	v4_mapped(&flow->daddr, d4);
	return own_addrs.lookup(&flow->saddr) != 0;
}

static __always_inline void emit(struct fs_retransmit_event *ev)
{
	if (events.ringbuf_output(ev, sizeof(*ev), 0) == 0)
		stat_add(FS_STAT_EMITTED, 1);
	else
		stat_add(FS_STAT_LOST, 1);
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)
{
	struct fs_retransmit_event ev = {};

	stat_add(FS_STAT_HITS, 1);
	if (!own_flow(&ev.flow, args->saddr_v6, args->daddr_v6, args->saddr, args->daddr))
		return 0;
	ev.ts_ns = bpf_ktime_get_ns();
	ev.flow.sport = args->sport;
	ev.flow.dport = args->dport;
	ev.family = args->family;
	ev.state = args->state;
#ifdef FS_TP_HAS_ERR
	ev.err = args->err;
#endif
	ev.kind = FS_KIND_SKB;
	/* err 0: sent; err > 0: NET_XMIT_DROP from the qdisc, which runs after TC
	 * egress. Both passed TC, so the flow's last egress packet is this one. */
	if (ev.err >= 0) {
		struct fs_egress *seen = egress.lookup(&ev.flow);
		if (seen) {
			ev.segs = seen->gso_segs;
			egress.delete(&ev.flow);
		} else {
			stat_add(FS_STAT_SEGS_UNKNOWN, 1);
		}
	}
	emit(&ev);
	return 0;
}

#ifdef FS_TP_SYNACK
TRACEPOINT_PROBE(tcp, tcp_retransmit_synack)
{
	struct fs_retransmit_event ev = {};

	stat_add(FS_STAT_HITS, 1);
	if (!own_flow(&ev.flow, args->saddr_v6, args->daddr_v6, args->saddr, args->daddr))
		return 0;
	ev.ts_ns = bpf_ktime_get_ns();
	ev.flow.sport = args->sport;
	ev.flow.dport = args->dport;
	ev.family = args->family;
	ev.state = 3;          /* TCP_SYN_RECV */
	ev.segs = 1;           /* a SYN-ACK is one segment */
	ev.kind = FS_KIND_SYNACK;
	emit(&ev);
	return 0;
}

#endif

/* TC egress, direct action: remember gso_segs of the last own TCP packet per flow.
 * Returns TC_ACT_UNSPEC (not OK) so filters of other tools behind ours still run. */
int tc_egress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct fs_flow flow = {};
	__u8 *l4;

	if ((void *)(eth + 1) > data_end)
		return TC_ACT_UNSPEC;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > data_end || ip->protocol != IPPROTO_TCP)
			return TC_ACT_UNSPEC;
		v4_mapped(&flow.saddr, &ip->saddr);
		v4_mapped(&flow.daddr, &ip->daddr);
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
	if ((void *)(l4 + 4) > data_end)
		return TC_ACT_UNSPEC;
	if (!own_addrs.lookup(&flow.saddr))
		return TC_ACT_UNSPEC;
	flow.sport = ((__u16)l4[0] << 8) | l4[1];
	flow.dport = ((__u16)l4[2] << 8) | l4[3];

	struct fs_egress seen = {
		.ts_ns = bpf_ktime_get_ns(),
		.gso_segs = skb->gso_segs ? skb->gso_segs : 1,
		.len = skb->len,
	};
	egress.update(&flow, &seen);
	stat_add(FS_STAT_TC_PACKETS, 1);
	return TC_ACT_UNSPEC;
}
