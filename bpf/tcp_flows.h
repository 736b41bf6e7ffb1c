/* Shared between bpf/tcp_flows.bpf.c and agent/probes/tcp/flow_layout.py
 * (ctypes mirrors; sizes and offsets are checked at load time and in tests). */
#ifndef FABRICSCOPE_TCP_FLOWS_H
#define FABRICSCOPE_TCP_FLOWS_H

#include "tcp_common.h"

#define FS_RTT_BUCKETS 24    /* log2 of microseconds: [2^i, 2^(i+1)); the last is open */
#define FS_CWND_BUCKETS 16   /* log2 of segments */
#define FS_SSTHRESH_INFINITE 0x7fffffff   /* TCP_INFINITE_SSTHRESH: not set yet */

/* flow event types */
#define FS_EV_OPEN 1         /* -> ESTABLISHED */
#define FS_EV_CLOSE 2        /* -> CLOSE */
#define FS_EV_RST_SENT 3     /* tcp/tcp_send_reset */
#define FS_EV_RST_RECV 4     /* tcp/tcp_receive_reset */
#define FS_EV_TRANSFER 5     /* a transfer ended: a run of a socket's traffic without a gap */

/* indexes of the per-CPU `flow_stats` array */
#define FS_FSTAT_PROBE_HITS 0    /* tcp_probe hits on own flows (segments received) */
#define FS_FSTAT_RTT_SAMPLES 1   /* of which advanced snd_una: RTT samples */
#define FS_FSTAT_EMITTED 2       /* flow events written */
#define FS_FSTAT_LOST 3          /* flow events lost: ring buffer full */
#define FS_FSTAT_NO_SLOT 4       /* tcp_probe hits not counted: flow map update failed */
#define FS_FSTAT_STATE_HITS 5    /* inet_sock_set_state hits on own TCP sockets */
#define FS_FSTAT_TRANSFERS 6     /* transfers reported (also in EMITTED or LOST) */
#define FS_FSTAT_TRANSFERS_SMALL 7   /* transfers under FS_TRANSFER_MIN_BYTES: not reported */
#define FS_FSTAT_TRANSFERS_TAIL 8    /* of TRANSFERS: under the minimum, reported as the rest of
                                      * the one before (FS_TRANSFER_TAIL_NS) */
#define FS_FSTAT_RECOVERED 9     /* bytes received in tcp_probe hits our program missed,
                                  * counted from our ACKs (recover_received) */
#define FS_FSTAT_CLOSED_AT_DESTROY 10 /* closes reported at socket teardown: their
				      * inet_sock_set_state hit was skipped */
#define FS_FSTAT_OPENED_AT_FIRST_ACK 11 /* opens reported at the socket's first
					* acknowledging packet: their ESTABLISHED hit was skipped */
#define FS_FSTAT_CLOSED_AT_REUSE 12 /* closes reported when the socket's address was
				     * reused: its CLOSE and tcp_destroy_sock hits were both
				     * skipped (found by TC egress or the next socket's hit) */
#define FS_FSTAT_CLOSED_AT_SWEEP 13 /* closes reported by user space's sweep: the socket
				     * was gone from sock_diag with its entry still here */
#define FS_FSTAT_ACKED_BEFORE_FIRST_HIT 14 /* bytes acknowledged before a socket's
					    * first tcp_probe hit, counted from the first
					    * sequence number TC saw leave (una_baseline) */
#define FS_FSTAT_UNACKED 15 /* bytes counted at their hits that our ACKs did not
			     * cover: duplicates, drops after the hit, out-of-order data
			     * (counted again when acknowledged: recover_received) */
#define FS_FSTAT_SENT_AFTER_GAP 16 /* bytes acknowledged at a transfer's first hit that
				   * it sent itself, in hits skipped (ended_share) */
#define FS_FSTAT_ACKED_AT_CLOSE 17 /* bytes acknowledged that no tcp_probe hit counted,
				   * found at a close after our FIN was acknowledged
				   * (acked_at_close) */
#define FS_NFSTATS 18

/* One flow's aggregates over one window, on one CPU. */
struct fs_flow_slot {
	__u32 gen;            /* window generation these numbers belong to */
	__u32 segs_in;        /* tcp_probe hits: segments received while established */
	__u32 rtt_samples;    /* hits that saw snd_una advance (srtt was updated) */
	__u32 rtt_min_us;
	__u32 rtt_max_us;
	__u32 cwnd_min;
	__u32 cwnd_max;
	__u32 ssthresh_min;   /* FS_SSTHRESH_INFINITE values are left out */
	__u32 ssthresh_max;
	__u32 pad;
	__u64 acked;          /* bytes: sum of snd_una advances */
	__u64 rtt_sum_us;
	__u64 rtt_sumsq_us;   /* us^2 */
	__u64 received;       /* bytes: TCP payload of the segments received */
	__u32 rtt_hist[FS_RTT_BUCKETS];
	__u32 cwnd_hist[FS_CWND_BUCKETS];
};

/* Two slots, written by generation parity: user space reads the one not being
 * written (see bpf/tcp_flows.bpf.c). */
struct fs_flow_stat {
	struct fs_flow_slot slot[2];
};

/* Per own socket (key: skaddr): lifecycle and snd_una/snd_nxt tracking. */
struct fs_sock {
	__u64 start_ns;       /* SYN_SENT seen (active open); 0: not seen */
	__u64 est_ns;         /* ESTABLISHED seen; 0: not seen */
	__u64 acked;          /* bytes: snd_una advances since the baseline (una_baseline) */
	__u64 sent;           /* bytes: snd_nxt advances since the baseline */
	__u64 received;       /* bytes: payload of the segments received */
	__u64 xfer_start;     /* the transfer in progress: first hit that moved bytes; 0: none */
	__u64 xfer_last;      /* its last hit that moved bytes */
	__u64 xfer_in;        /* its payload received */
	__u64 xfer_out;       /* its bytes acknowledged by the peer */
	__u64 xfer_reported_end;  /* last hit of the socket's last reported transfer; 0: none */
	__u32 last_una;
	__u32 last_nxt;
	__u8 has_una;         /* last_una/last_nxt are set */
	__u8 active;          /* 1: this side connected */
	__u8 has_ack;         /* last_ack/rcv_acked are set */
	__u8 pad;
	__u32 pid;            /* the process that connected (tgid at SYN_SENT); 0: unknown */
	__u64 rcv_acked;      /* bytes our ACKs acknowledged since last_ack was first seen,
	                       * on `received`'s scale (set equal to it then) */
	__u64 last_in_ns;     /* the last hit that received payload */
	__u32 last_ack;       /* acknowledgment number of our last packet out (TC egress) */
	__u32 xfer_nxt;       /* snd_nxt at the transfer's last hit */
	__u64 made_ns;        /* when this entry was made (tells a new socket's from a
	                       * freed one's at the same address) */
	__u64 cookie;         /* socket cookie (TC egress, the socket's first packet with
	                       * an entry here): user space's sweep asks sock_diag whether
	                       * the socket still lives; 0: unknown */
};

/* The socket user space's sweep replays teardown for (`sweeping`[0]); 0: none. */
struct fs_sweep {
	__u64 sk;
	__u64 cookie;
};

struct fs_flow_event {
	__u64 ts_ns;          /* bpf_ktime_get_ns */
	struct fs_flow flow;
	__u16 family;         /* AF_INET 2, AF_INET6 10; 0 for resets (sockaddr gives it) */
	__u8 type;            /* FS_EV_* */
	__u8 active;          /* open/close: 1 when this side connected */
	__s32 oldstate;       /* open/close: state before */
	__s32 state;          /* open/close: new state; resets: socket state (0: none) */
	__u32 reason;         /* sent resets: enum sk_rst_reason (6.10+); FS_RST_REASON_NONE */
	__u32 flags;          /* close: 1 established seen, 2 snd_una seen;
	                       * transfer: 4 the socket reported a transfer before (gap_ns) */
	__u64 duration_ns;    /* open: SYN_SENT -> ESTABLISHED; close: ESTABLISHED -> CLOSE;
	                       * transfer: first to last hit (ts_ns: its first) */
	__u64 bytes_acked;    /* close: sum of snd_una advances seen; transfer: its share */
	__u64 bytes_sent;     /* close: sum of snd_nxt advances seen */
	__u64 bytes_received; /* close: payload received; transfer: its payload received */
	__u32 pid;            /* open/close/transfer: the process that connected (host pid
	                       * namespace); 0: unknown (passive side, or opened before attach) */
	__u32 pad;
	__u64 gap_ns;         /* transfer: since the socket's previous reported transfer ended */
};

#define FS_RST_REASON_NONE 0xffffffff   /* the kernel's tcp_send_reset has no reason */
#define FS_CLOSE_ESTABLISHED 1
#define FS_CLOSE_UNA 2
#define FS_TRANSFER_AFTER_REPORTED 4

#endif
