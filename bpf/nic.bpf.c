// SPDX-License-Identifier: Apache-2.0
/* nic: bytes and packets of every NIC in fixed time bins, per flow, and drop reasons.
 *
 * Hooks (stable ABI only; no kernel struct is read):
 *   TC ingress, TC egress (cls_bpf, direct action, on clsact)  every skb
 *   tracepoint skb/kfree_skb (only with -DFS_NIC_DROPS=1)       every skb freed as dropped
 *
 * Bins: bin = bpf_ktime_get_ns() / FS_NIC_BIN_NS. Each (interface, direction) owns
 * a ring of FS_NIC_RING_SLOTS bins per CPU; the slot of bin b holds b's low 32 bits
 * as its epoch, and a packet of a newer bin resets the slot before counting, so a
 * bin never mixes two time windows. User space drains only bins older than the
 * current one and remembers the last bin it consumed, so a late drain neither
 * double counts nor mixes windows; a ring that wraps before the drain loses the
 * oldest bins, which user space counts. Each CPU writes a region of its own: no
 * atomics, no cache line bouncing between CPUs sending on one NIC. The regions
 * live in one array that user space maps into its memory (BPF_F_MMAPABLE, 5.5+):
 * a drain reads the bins where the kernel wrote them, with no syscall and no copy
 * (a per-CPU array is read through bpf() only, one copy per bin and CPU).
 *
 * Egress runs before the root qdisc: a shaped or congested NIC's egress bins show
 * the offered load at enqueue time, its peer's ingress shows the wire.
 *
 * Flows: 5-tuple (IPv4/IPv6, TCP/UDP ports) read from the skb's linear data (the
 * helper copies what is not there), per-CPU LRU hash of growing counters (user
 * space takes deltas per window).
 *
 * Returns TC_ACT_UNSPEC so that other filters on the same clsact still run.
 *
 * Options (cflags): -DFS_NIC_BIN_NS=n -DFS_NIC_RING_SLOTS=n (power of two)
 * -DFS_NIC_CPUS=n (highest possible CPU id + 1) -DFS_NIC_RINGS=n
 * -DFS_NIC_MAX_IFACES=n -DFS_NIC_MAX_FLOWS=n; -DFS_NIC_DROPS=1 with
 * -DFS_NIC_REASON_OFF=n adds the drop counter (attached by the loader);
 * -DFS_NIC_PARTS=mask, what the TC programs do, for bench/nic_parts.py only (the
 * agent compiles all of it): FS_NIC_PART_* below, 0 returns at once.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/pkt_cls.h>
#include "nic.h"
#define FS_STATS_SLOTS FS_NIC_NSTATS
#include "fs_common.h"

#ifndef FS_NIC_BIN_NS
#define FS_NIC_BIN_NS 100000
#endif
#ifndef FS_NIC_RING_SLOTS
#define FS_NIC_RING_SLOTS 8192
#endif
#ifndef FS_NIC_RINGS
#define FS_NIC_RINGS 2
#endif
#ifndef FS_NIC_CPUS
#define FS_NIC_CPUS 1
#endif
#ifndef BPF_F_MMAPABLE
#define BPF_F_MMAPABLE (1U << 10)   /* uapi linux/bpf.h; older headers lack it */
#endif
#ifndef FS_NIC_MAX_IFACES
#define FS_NIC_MAX_IFACES 64
#endif
#ifndef FS_NIC_MAX_FLOWS
#define FS_NIC_MAX_FLOWS 8192
#endif
#ifndef FS_NIC_DROPS
#define FS_NIC_DROPS 0
#endif
#define FS_NIC_PART_LOOKUP 1    /* the interface lookup and the clock */
#define FS_NIC_PART_BINS 2      /* + the time bins */
#define FS_NIC_PART_FLOWS 4     /* + the flow table */
#ifndef FS_NIC_PARTS
#define FS_NIC_PARTS (FS_NIC_PART_LOOKUP | FS_NIC_PART_BINS | FS_NIC_PART_FLOWS)
#endif

/* slot of bin b of ring r on CPU c: (r * FS_NIC_CPUS + c) * FS_NIC_RING_SLOTS + (b & mask) */
BPF_F_TABLE("array", __u32, struct fs_nic_bin, fs_nic_ring,
	    FS_NIC_RINGS * FS_NIC_CPUS * FS_NIC_RING_SLOTS, BPF_F_MMAPABLE);
/* Watched interfaces by ifindex: an array for the small ifindexes almost every host
 * has (a lookup the verifier inlines), a hash for the rest (a host with veth churn
 * counts ifindexes up into the thousands). */
BPF_ARRAY(fs_nic_iface_slots, struct fs_nic_iface, FS_NIC_IFINDEX_SLOTS);
BPF_HASH(fs_nic_ifaces, __u32, struct fs_nic_iface, FS_NIC_MAX_IFACES);
BPF_TABLE("lru_percpu_hash", struct fs_nic_flow_key, struct fs_nic_flow_val, fs_nic_flows,
	  FS_NIC_MAX_FLOWS);
/* Packets counted per ring: user space skips reading the bins of a ring whose count
 * did not move since its last drain (an idle interface costs no slot reads). */
BPF_PERCPU_ARRAY(fs_nic_ring_pkts, __u64, FS_NIC_RINGS);

static __always_inline void count_bin(__u32 ring, __u64 ts, __u32 len, __u32 segs)
{
	__u64 bin = ts / FS_NIC_BIN_NS;
	__u32 cpu = bpf_get_smp_processor_id();
	__u32 idx = (ring * FS_NIC_CPUS + cpu) * FS_NIC_RING_SLOTS +
		    (__u32)(bin & (FS_NIC_RING_SLOTS - 1));
	__u32 off = (__u32)(ts - bin * FS_NIC_BIN_NS);
	struct fs_nic_bin *b = fs_nic_ring.lookup(&idx);

	if (!b) {
		stat_add(FS_NIC_STAT_RING_MISS, 1);
		return;
	}
	if (b->epoch != (__u32)bin) {
		b->epoch = (__u32)bin;
		b->bytes = 0;
		b->packets = 0;
		b->first_off = off;
	}
	b->bytes += len;
	b->packets += segs;
	b->last_off = off;
	__u64 *n = fs_nic_ring_pkts.lookup(&ring);
	if (n)
		*n += 1;
}

/* len bytes of the frame at off: straight from the skb's linear data when they are
 * there (headers almost always are), else copied by the helper (paged or
 * non-linear skbs); <0 when the frame is shorter. */
static __always_inline int load_hdr(struct __sk_buff *skb, __u32 off, void *dst, __u32 len)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;

	if (off <= FS_NIC_MAX_HDR_OFF && data + off + len <= end) {
		__builtin_memcpy(dst, data + off, len);
		return 0;
	}
	return bpf_skb_load_bytes(skb, off, dst, len);
}

/* Network header offset and ethertype (network order); -1 when unreadable. */
static __always_inline int l3_start(struct __sk_buff *skb, __u32 l2_len, __u16 *proto)
{
	__u16 et = (__u16)skb->protocol;

	if (l2_len && (et == htons(ETH_P_8021Q) || et == htons(ETH_P_8021AD))) {
		/* tag still in the frame (no VLAN offload): inner ethertype follows it */
		if (load_hdr(skb, l2_len + 2, &et, 2) < 0)
			return -1;
		l2_len += 4;
	}
	*proto = et;
	return l2_len;
}

static __always_inline int parse_flow(struct __sk_buff *skb, __u32 l2_len,
				      struct fs_nic_flow_key *k, __u8 *tos)
{
	__u16 et = 0;
	int off = l3_start(skb, l2_len, &et);
	__u8 l4proto, ports_known = 1;
	__u32 l4off;

	if (off < 0)
		return -FS_NIC_STAT_SHORT;
	if (et == htons(ETH_P_IP)) {
		__u8 h[20];
		if (load_hdr(skb, off, h, 20) < 0)
			return -FS_NIC_STAT_SHORT;
		k->family = 4;
		*tos = h[1];
		l4proto = h[9];
		__builtin_memcpy(k->saddr, &h[12], 4);
		__builtin_memcpy(k->daddr, &h[16], 4);
		l4off = off + (h[0] & 0xf) * 4;
		if (((h[6] & 0x1f) | h[7]) != 0)  /* not the first fragment: no ports */
			ports_known = 0;
	} else if (et == htons(ETH_P_IPV6)) {
		__u8 h[40];
		if (load_hdr(skb, off, h, 40) < 0)
			return -FS_NIC_STAT_SHORT;
		k->family = 6;
		*tos = (__u8)((h[0] << 4) | (h[1] >> 4));
		l4proto = h[6];
		__builtin_memcpy(k->saddr, &h[8], 16);
		__builtin_memcpy(k->daddr, &h[24], 16);
		l4off = off + 40;   /* extension headers are not walked: ports stay 0 */
	} else {
		return -FS_NIC_STAT_NOT_IP;
	}
	k->proto = l4proto;
	if (ports_known && (l4proto == IPPROTO_TCP || l4proto == IPPROTO_UDP)) {
		__u16 ports[2];
		if (load_hdr(skb, l4off, ports, 4) < 0)
			return -FS_NIC_STAT_SHORT;
		k->sport = ntohs(ports[0]);
		k->dport = ntohs(ports[1]);
	}
	return 0;
}

static __always_inline void count_flow(struct __sk_buff *skb, __u32 l2_len, __u8 dir,
				       __u64 ts, __u32 len, __u32 segs)
{
	struct fs_nic_flow_key k = {};
	struct fs_nic_flow_val *v, zero = {};
	__u8 tos = 0;
	int err = parse_flow(skb, l2_len, &k, &tos);

	if (err) {
		stat_add(-err, 1);
		return;
	}
	k.ifindex = skb->ifindex;
	k.dir = dir;
	v = fs_nic_flows.lookup(&k);
	if (!v) {
		/* another CPU may insert the same key meanwhile: then our copy exists too */
		fs_nic_flows.update(&k, &zero);
		v = fs_nic_flows.lookup(&k);
		if (!v) {
			stat_add(FS_NIC_STAT_FLOW_FULL, 1);
			return;
		}
	}
	v->bytes += len;
	v->packets += segs;
	v->last_ns = ts;
	v->dscp = tos >> 2;
	if ((tos & 3) == 3)
		v->ce += segs;
}

static __always_inline struct fs_nic_iface *iface_of(__u32 ifindex)
{
	if (ifindex < FS_NIC_IFINDEX_SLOTS) {
		struct fs_nic_iface *ifc = fs_nic_iface_slots.lookup(&ifindex);
		return ifc && ifc->watched ? ifc : 0;
	}
	return fs_nic_ifaces.lookup(&ifindex);
}

/* skbs seen = the rings' packet counts + FS_NIC_STAT_NO_IFACE: no counter of its own. */
static __always_inline int handle(struct __sk_buff *skb, __u8 dir)
{
	if (!(FS_NIC_PARTS & FS_NIC_PART_LOOKUP))
		return TC_ACT_UNSPEC;       /* the bare hook (bench/nic_parts.py) */

	struct fs_nic_iface *ifc = iface_of(skb->ifindex);
	__u64 ts = bpf_ktime_get_ns();
	__u32 segs = skb->gso_segs ? skb->gso_segs : 1;

	if (!ifc) {
		stat_add(FS_NIC_STAT_NO_IFACE, 1);
		return TC_ACT_UNSPEC;
	}
	if (FS_NIC_PARTS & FS_NIC_PART_BINS)
		count_bin(ifc->ring + dir, ts, skb->len, segs);
	if (FS_NIC_PARTS & FS_NIC_PART_FLOWS)
		count_flow(skb, ifc->l2_len, dir, ts, skb->len, segs);
	return TC_ACT_UNSPEC;
}

int fs_nic_ingress(struct __sk_buff *skb)
{
	return handle(skb, FS_NIC_RX);
}

int fs_nic_egress(struct __sk_buff *skb)
{
	return handle(skb, FS_NIC_TX);
}

/* Never written: exposes the shared layouts to the loader's size check. */
BPF_ARRAY(fs_nic_layout_iface, struct fs_nic_iface, 1);

#if FS_NIC_DROPS
/* kfree_skb carries no ifindex and no network namespace: counts are host-wide.
 * The context is the tracepoint's record; the loader reads the offset of `reason`
 * from its format file (-DFS_NIC_REASON_OFF), so no kernel header defines it. */
BPF_PERCPU_ARRAY(fs_nic_drops, __u64, FS_NIC_DROP_SLOTS);

struct fs_nic_kfree_skb_args {
	__u8 head[FS_NIC_REASON_OFF];
	__u32 reason;
};

int fs_nic_kfree_skb(struct fs_nic_kfree_skb_args *args)
{
	__u32 reason = args->reason;
	__u32 slot = reason < FS_NIC_DROP_OTHER ? reason : FS_NIC_DROP_OTHER;
	__u64 *v = fs_nic_drops.lookup(&slot);

	if (v)
		*v += 1;
	return 0;
}
#endif
