/* Shared between bpf/nic.bpf.c and agent/probes/nic_*.py (ctypes/numpy mirrors;
 * sizes are checked against the compiled layout at load time and in tests). */
#ifndef FABRICSCOPE_NIC_H
#define FABRICSCOPE_NIC_H

#include <linux/types.h>

/* directions: index within an interface's pair of rings */
#define FS_NIC_RX 0   /* TC ingress */
#define FS_NIC_TX 1   /* TC egress (before the root qdisc) */

/* indexes of the per-CPU `fs_nic_stats` array */
#define FS_NIC_STAT_SKBS 0        /* not counted by the programs (saves a write per skb):
                                   * user space sums fs_nic_ring_pkts + NO_IFACE */
#define FS_NIC_STAT_NO_IFACE 1    /* skbs on an ifindex the agent did not register */
#define FS_NIC_STAT_NOT_IP 2      /* skbs that are neither IPv4 nor IPv6 (ARP, LLDP...) */
#define FS_NIC_STAT_SHORT 3       /* skbs too short for the headers they announce */
#define FS_NIC_STAT_FLOW_FULL 4   /* flow updates that failed (map full, not evictable) */
#define FS_NIC_STAT_RING_MISS 5   /* ring lookups that failed (never expected) */
#define FS_NIC_NSTATS 6

/* Drop-reason slots of `fs_nic_drops`: reason r counts at r, reasons beyond
 * (subsystem reasons carry high bits) at FS_NIC_DROP_OTHER. */
#define FS_NIC_DROP_SLOTS 512
#define FS_NIC_DROP_OTHER (FS_NIC_DROP_SLOTS - 1)

/* One bin of one ring on one CPU. Bin b of ring r on CPU c lives at slot
 * (r * CPUS + c) * RING_SLOTS + (b & (RING_SLOTS - 1)); `epoch` is the low 32 bits of b: a
 * packet of another bin resets the slot first, so a slot never mixes two bins.
 * Offsets are nanoseconds after the bin's start (bin b starts at b * BIN_NS). */
struct fs_nic_bin {
	__u32 epoch;
	__u32 bytes;        /* skb->len (L2 frame, GSO skbs whole) */
	__u32 packets;      /* wire segments: gso_segs, 1 for a non-GSO skb */
	__u32 first_off;    /* first packet of the bin */
	__u32 last_off;     /* last packet of the bin */
	__u32 pad;
};

/* Interfaces with an ifindex below this live in the array `fs_nic_iface_slots`
 * (index: ifindex), the others in the hash `fs_nic_ifaces` (key: ifindex). */
#ifndef FS_NIC_IFINDEX_SLOTS
#define FS_NIC_IFINDEX_SLOTS 1024
#endif
/* Farthest header offset read straight from the skb's data (verifier bound). */
#define FS_NIC_MAX_HDR_OFF 256

/* A watched interface: which rings it writes. */
struct fs_nic_iface {
	__u32 ring;         /* ring index of RX; TX is ring + 1 */
	__u16 l2_len;       /* bytes before the network header: 14 Ethernet, 0 raw IP */
	__u16 watched;      /* 1; 0: an empty slot of fs_nic_iface_slots */
};

/* Key of `fs_nic_flows`. Addresses: IPv4 in the first 4 bytes, rest zero. */
struct fs_nic_flow_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__u32 ifindex;
	__u16 sport;        /* host byte order; 0 without ports (ICMP, fragments) */
	__u16 dport;
	__u8 proto;         /* IPPROTO_* (IPv6: the first next-header) */
	__u8 family;        /* 4 or 6 */
	__u8 dir;           /* FS_NIC_RX or FS_NIC_TX */
	__u8 pad;
};

/* Per-CPU value of `fs_nic_flows`; counters only grow (user space takes deltas). */
struct fs_nic_flow_val {
	__u64 bytes;
	__u64 last_ns;      /* bpf_ktime_get_ns of the last packet */
	__u32 packets;      /* wire segments */
	__u32 ce;           /* wire segments with ECN CE (IP ECN bits 11) */
	__u8 dscp;          /* DSCP of the last packet */
	__u8 pad[7];
};

#endif
