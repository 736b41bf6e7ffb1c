/* Shared between bpf/tcp_retransmit.bpf.c and agent/probes/tcp/retransmit.py
 * (ctypes mirror; sizes and offsets are checked at load time and in tests). */
#ifndef FABRICSCOPE_TCP_RETRANSMIT_H
#define FABRICSCOPE_TCP_RETRANSMIT_H

#include "tcp_common.h"

/* hooks an event comes from */
#define FS_HOOK_SKB 1      /* tcp/tcp_retransmit_skb */
#define FS_HOOK_SYNACK 2   /* tcp/tcp_retransmit_synack (counted in RetransSegs too) */

/* ca_state of an event when tcp/tcp_cong_state_set is not available */
#define FS_CA_UNKNOWN 0xff

/* indexes of the per-CPU `stats` array */
#define FS_STAT_HITS 0          /* tracepoint hits, before the address filter */
#define FS_STAT_EMITTED 1       /* events written to the ring buffer */
#define FS_STAT_LOST 2          /* events lost: ring buffer full */
#define FS_STAT_SEGS_UNKNOWN 3  /* tracepoint fallback: events whose segment count TC
				 * egress did not see (0 in raw mode: TC emits them) */
#define FS_STAT_TC_PACKETS 4    /* own TCP packets (skbs) seen on TC egress */
#define FS_STAT_TC_SEGS 5       /* their wire segments (gso_segs) */
#define FS_STAT_TC_BYTES 6      /* their TCP payload bytes */
#define FS_STAT_CONG_SET 7      /* own congestion state changes seen */
#define FS_STAT_QDISC_DROPPED 8 /* raw tracepoint: retransmits TC egress counted that the
				 * qdisc after it dropped (err > 0; still in RetransSegs) */
#define FS_STAT_TC_RETRANSMITS 9 /* retransmitted skbs found on TC egress (raw mode) */
#define FS_NSTATS 10

/* Last packet of a flow seen leaving on TC egress. */
struct fs_egress {
	__u64 ts_ns;
	__u32 gso_segs;   /* segments on the wire (tcp_skb_pcount of the skb) */
	__u32 bytes;      /* TCP payload bytes of the skb (all its segments) */
	__u32 ack_seq;    /* its acknowledgment number: the socket's rcv_nxt when sent */
	__u32 has_ack;    /* 1: ack_seq is set (the ACK flag was on, this or an earlier packet) */
};

/* An own socket as TC egress saw it leave (key: the socket's address, which the
 * raw tracepoints get as their only socket argument). */
struct fs_sock_tx {
	__u64 ts_ns;      /* bpf_ktime_get_ns at TC egress of its last packet */
	struct fs_flow flow;
	__u16 family;     /* AF_INET 2, AF_INET6 10 (of the packet) */
	__u8 state;       /* from the TCP flags: SYN_SENT 2 for a SYN, else ESTABLISHED 1 */
	__u8 last_flags;  /* TCP flags of the last packet */
	__u32 snd_end;    /* highest sequence number sent + 1 (SYN and FIN count one) */
	__u32 last_seq;   /* sequence number of the last packet */
	__u32 ack_seq;    /* as in fs_egress */
	__u32 has_ack;
	__u32 ifindex;    /* interface the last packet left through */
	__u32 last_bytes; /* payload of the last packet */
	__u64 ack_ns;     /* when ack_seq first left (a later packet repeating it, as a
	                   * request that follows a read does, leaves it as it was) */
	__u32 first_seq;  /* the first sequence number of the connection's data that TC
	                   * saw leave (after a SYN: the one it takes), tcp_flows' baseline
	                   * for bytes acknowledged before its first tcp_probe hit */
	__u32 burst_seq;  /* where its data last resumed after FS_SEND_PAUSE_NS without a
	                   * packet */
};

/* Congestion state of one own socket (key: skaddr), from tcp/tcp_cong_state_set. */
struct fs_cong {
	__u8 ca_state;    /* TCP_CA_Open 0, Disorder 1, CWR 2, Recovery 3, Loss 4 */
	__u8 timeout;     /* 1: entered Loss and not retransmitted since (the RTO timer) */
	__u8 pad[6];
};

struct fs_retransmit_event {
	__u64 ts_ns;       /* bpf_ktime_get_ns */
	struct fs_flow flow;
	__u16 family;      /* AF_INET 2, AF_INET6 10 */
	__u16 segs;        /* segments retransmitted; 0: unknown */
	__s32 state;       /* TCP state (TCP_ESTABLISHED 1 ...) */
	__s32 err;         /* 0: sent; >0: NET_XMIT_* from the qdisc; <0: -errno */
	__u8 hook;         /* FS_HOOK_* */
	__u8 ca_state;     /* congestion state when retransmitted; FS_CA_UNKNOWN */
	__u8 timeout;      /* 1: the first retransmit after entering Loss: the RTO's */
	__u8 pad;
	__u32 bytes;       /* payload bytes retransmitted (TC egress); 0: unknown */
};

#endif
