/* Shared between bpf/tcp_retransmit.bpf.c and agent/probes/tcp_retransmit.py
 * (ctypes mirror; sizes and offsets are checked at load time and in tests). */
#ifndef FABRICSCOPE_TCP_RETRANSMIT_H
#define FABRICSCOPE_TCP_RETRANSMIT_H

#include <linux/types.h>

/* event kinds */
#define FS_KIND_SKB 1      /* tcp/tcp_retransmit_skb */
#define FS_KIND_SYNACK 2   /* tcp/tcp_retransmit_synack (counted in RetransSegs too) */

/* indexes of the per-CPU `stats` array */
#define FS_STAT_HITS 0          /* tracepoint hits, before the address filter */
#define FS_STAT_EMITTED 1       /* events written to the ring buffer */
#define FS_STAT_LOST 2          /* events lost: ring buffer full */
#define FS_STAT_SEGS_UNKNOWN 3  /* events whose segment count TC egress did not see */
#define FS_STAT_TC_PACKETS 4    /* own TCP packets seen on TC egress */
#define FS_NSTATS 5

/* An IPv6 address, or an IPv4 one as v4-mapped (::ffff:a.b.c.d). */
struct fs_addr {
	__u8 a[16];
};

/* A flow from this node's side; ports in host byte order (as the tracepoints). */
struct fs_flow {
	struct fs_addr saddr;
	struct fs_addr daddr;
	__u16 sport;
	__u16 dport;
};

/* Last packet of a flow seen leaving on TC egress. */
struct fs_egress {
	__u64 ts_ns;
	__u32 gso_segs;   /* segments on the wire (tcp_skb_pcount of the skb) */
	__u32 len;
};

struct fs_retransmit_event {
	__u64 ts_ns;       /* bpf_ktime_get_ns */
	struct fs_flow flow;
	__u16 family;      /* AF_INET 2, AF_INET6 10 */
	__u16 segs;        /* segments retransmitted; 0: unknown */
	__s32 state;       /* TCP state (TCP_ESTABLISHED 1 ...) */
	__s32 err;         /* 0: sent; >0: NET_XMIT_* from the qdisc; <0: -errno */
	__u32 kind;        /* FS_KIND_* */
	__u32 pad;
};

#endif
