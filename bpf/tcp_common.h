/* SPDX-License-Identifier: Apache-2.0 */
/* Pieces every fabricscope TCP program shares: the flow key, v4-mapped
 * addresses, TCP state numbers, the own-address filter and sockaddr parsing.
 *
 * The types compile anywhere (the unit tests build them with the host cc to
 * check the ctypes mirrors); the helpers and the `own_addrs` map only inside
 * BCC (__BPF_TRACING__), which defines one map per program that includes this.
 *
 * Attribution: tracepoints carry no network namespace and one kernel serves
 * every lab node, so a program keeps an event only when the socket's local
 * address is in `own_addrs` (filled by the agent with its node's addresses,
 * IPv4 as v4-mapped ::ffff:a.b.c.d).
 */
#ifndef FABRICSCOPE_TCP_COMMON_H
#define FABRICSCOPE_TCP_COMMON_H

#include <linux/types.h>

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

#ifdef __BPF_TRACING__

#ifndef MAX_ADDRS
#define MAX_ADDRS 64
#endif

#define FS_AF_INET 2
#define FS_AF_INET6 10

/* TCP states (include/net/tcp_states.h, stable since 2.6) */
#define FS_TCP_ESTABLISHED 1
#define FS_TCP_SYN_SENT 2
#define FS_TCP_SYN_RECV 3
#define FS_TCP_FIN_WAIT1 4
#define FS_TCP_FIN_WAIT2 5
#define FS_TCP_CLOSE 7
#define FS_TCP_CLOSE_WAIT 8
#define FS_TCP_LAST_ACK 9
#define FS_TCP_LISTEN 10
#define FS_TCP_CLOSING 11

BPF_HASH(own_addrs, struct fs_addr, __u8, MAX_ADDRS);

static __always_inline void fs_v4_mapped(struct fs_addr *dst, const void *v4)
{
	__builtin_memset(dst, 0, sizeof(*dst));
	dst->a[10] = 0xff;
	dst->a[11] = 0xff;
	__builtin_memcpy(&dst->a[12], v4, 4);
}

/* Fill flow addresses from tracepoint fields that come as saddr[4]/saddr_v6[16]
 * pairs; 1 when the source is ours. The v6 fields hold v4-mapped addresses for
 * AF_INET sockets; the v4 fields are the fallback for v4 traffic on dual-stack
 * sockets. Ports are left to the caller. */
static __always_inline int fs_own_flow(struct fs_flow *flow, const __u8 *s6, const __u8 *d6,
				       const __u8 *s4, const __u8 *d4)
{
	__builtin_memcpy(flow->saddr.a, s6, 16);
	__builtin_memcpy(flow->daddr.a, d6, 16);
	if (own_addrs.lookup(&flow->saddr))
		return 1;
	fs_v4_mapped(&flow->saddr, s4);
	fs_v4_mapped(&flow->daddr, d4);
	return own_addrs.lookup(&flow->saddr) != 0;
}

/* Fill a flow from the sockaddr[28] pairs of tcp_probe / tcp_send_reset
 * (struct sockaddr_in or sockaddr_in6, as the socket's family; ports in network
 * order inside); 1 when the source is ours. */
static __always_inline int fs_own_sockaddr(struct fs_flow *flow, const __u8 *s, const __u8 *d)
{
	__u16 family;

	__builtin_memcpy(&family, s, 2);
	if (family == FS_AF_INET) {
		fs_v4_mapped(&flow->saddr, s + 4);
		fs_v4_mapped(&flow->daddr, d + 4);
	} else if (family == FS_AF_INET6) {
		__builtin_memcpy(flow->saddr.a, s + 8, 16);
		__builtin_memcpy(flow->daddr.a, d + 8, 16);
	} else {
		return 0;
	}
	flow->sport = ((__u16)s[2] << 8) | s[3];
	flow->dport = ((__u16)d[2] << 8) | d[3];
	return own_addrs.lookup(&flow->saddr) != 0;
}

#endif /* __BPF_TRACING__ */
#endif
