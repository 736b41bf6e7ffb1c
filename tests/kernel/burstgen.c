// SPDX-License-Identifier: Apache-2.0
/* burstgen: paced UDP bursts, with ground truth from where the frames left.
 *
 *   burstgen --dst ADDR [--port 9] [--rate 1gbit] [--frame 4042] [--bursts 1000,200]
 *            [--gap-ms 30] [--tap IFNAME] [--cpu N]
 *
 * Built and run by tests/kernel/burstgen.py. A burst is round(length / interval) frames
 * of --frame L2 bytes (UDP payload + 8 + 20 + 14), frame i due at start + i * interval
 * (interval: the frame's time at --rate), each sent once a busy wait on CLOCK_MONOTONIC
 * reaches its due time. The sender runs as SCHED_FIFO, locked in memory and pinned to
 * --cpu, each where allowed (silently as it is otherwise).
 *
 * --tap IFNAME: an AF_PACKET socket on IFNAME receives every outgoing frame as it leaves
 * (dev_queue_xmit_nit, after TC egress) with the kernel's software stamp (SO_TIMESTAMPNS,
 * CLOCK_REALTIME), converted to CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns, with an
 * offset bracketed by two monotonic reads just before each burst (error <= 0.5 us). Each
 * frame carries its burst and frame number. The tap must see every frame the sender sent,
 * once, with a stamp within 2 us of that frame's send call (IFNAME has no queue, as a
 * veth: a frame leaves inside send()); otherwise the program stops with exit status 3 and
 * says why.
 *
 * One JSON line per burst: start_ns and end_ns (first and last departure, monotonic),
 * bytes and packets (L2 bytes and frames that left), planned_us, max_gap_ns (largest gap
 * between consecutive departures), departures_ns (each frame's departure - start_ns) and
 * sent_ns (the monotonic time its send call began - start_ns; <= its departure). Without
 * --tap a frame's departure is the time its send call began.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HEADERS (14 + 20 + 8)
#define MAGIC 0x66736267u           /* "fsbg" */
#define WARMUP UINT32_MAX           /* burst number of the warm-up frames */
#define OFFSET_ERR_NS 500           /* error of the realtime-monotonic offset, at most */
#define STAMP_SLACK_NS 2000         /* a stamp's error allowed around its send call */
#define SPIN_NS 200000              /* busy wait this long before a burst, not sleep */

struct tag {
	uint32_t magic, burst, frame;
};

struct frame {
	int64_t before, after;          /* monotonic, around send() */
	int64_t stamp;                  /* monotonic departure; 0: not seen (yet) */
	uint32_t len;                   /* L2 bytes seen by the tap */
	int sent;
};

static void die(int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("burstgen: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(code);
}

static int64_t now_ns(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* CLOCK_REALTIME - CLOCK_MONOTONIC, from the tightest of a few bracketed reads; within
 * OFFSET_ERR_NS of the truth, or the program stops. */
static int64_t real_minus_mono(void)
{
	int64_t best_w = INT64_MAX, best = 0;

	for (int k = 0; k < 100 && (k < 9 || best_w > 2 * OFFSET_ERR_NS); k++) {
		int64_t m1 = now_ns(CLOCK_MONOTONIC);
		int64_t r = now_ns(CLOCK_REALTIME);
		int64_t m2 = now_ns(CLOCK_MONOTONIC);

		if (m2 - m1 < best_w) {
			best_w = m2 - m1;
			best = r - (m1 + (m2 - m1) / 2);
		}
	}
	if (best_w > 2 * OFFSET_ERR_NS)
		die(3, "cannot read the two clocks within %d ns of each other", 2 * OFFSET_ERR_NS);
	return best;
}

static void sleep_until(int64_t t)
{
	struct timespec ts = { t / 1000000000, t % 1000000000 };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static int64_t parse_rate(const char *s)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || v <= 0)
		die(2, "bad --rate %s", s);
	if (!strcmp(end, "kbit"))
		v *= 1e3;
	else if (!strcmp(end, "mbit"))
		v *= 1e6;
	else if (!strcmp(end, "gbit"))
		v *= 1e9;
	else if (*end)
		die(2, "bad --rate %s", s);
	return (int64_t)v;
}

static int open_tap(const char *ifname)
{
	struct sockaddr_ll sll = { .sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL) };
	int one = 1, rcvbuf = 64 << 20;
	/* protocol 0 until bound: no frame of another interface gets in meanwhile */
	int fd = socket(AF_PACKET, SOCK_RAW, 0);

	if (fd < 0)
		die(3, "AF_PACKET socket: %s", strerror(errno));
	sll.sll_ifindex = (int)if_nametoindex(ifname);
	if (!sll.sll_ifindex)
		die(2, "no interface %s", ifname);
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf)) < 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
	if (setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one)) < 0)
		die(3, "SO_TIMESTAMPNS: %s", strerror(errno));
	if (bind(fd, (struct sockaddr *)&sll, sizeof(sll)) < 0)
		die(3, "bind to %s: %s", ifname, strerror(errno));
	return fd;
}

/* One frame from the tap, without waiting: 1 and *tag, *len, *stamp_real for one of our
 * UDP frames leaving, 0 for anything else, -1 when the queue is empty. */
static int tap_read(int fd, uint16_t sport, uint16_t dport, struct tag *tag, uint32_t *len,
		    int64_t *stamp_real)
{
	unsigned char buf[128], ctl[256];
	struct sockaddr_ll from;
	struct iovec iov = { buf, sizeof(buf) };
	struct msghdr msg = { .msg_name = &from, .msg_namelen = sizeof(from), .msg_iov = &iov,
			      .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl) };
	ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_TRUNC);
	struct cmsghdr *c;
	size_t ihl, copied;
	int stamped = 0;

	if (n < 0) {
		if (errno == EAGAIN || errno == EINTR)
			return -1;
		die(3, "tap recvmsg: %s", strerror(errno));
	}
	copied = (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf);
	if (from.sll_pkttype != PACKET_OUTGOING || copied < 14 + 20 ||
	    buf[12] != 0x08 || buf[13] != 0x00 || buf[14 + 9] != IPPROTO_UDP)
		return 0;
	ihl = (size_t)(buf[14] & 0xf) * 4;
	if (copied < 14 + ihl + 8 + sizeof(*tag))
		return 0;
	if (((buf[14 + ihl] << 8) | buf[14 + ihl + 1]) != sport ||
	    ((buf[14 + ihl + 2] << 8) | buf[14 + ihl + 3]) != dport)
		return 0;
	memcpy(tag, buf + 14 + ihl + 8, sizeof(*tag));
	if (tag->magic != MAGIC)
		return 0;
	for (c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
			struct timespec ts;

			memcpy(&ts, CMSG_DATA(c), sizeof(ts));
			*stamp_real = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
			stamped = 1;
		}
	}
	if (!stamped)
		die(3, "tap frame without a kernel stamp");
	*len = (uint32_t)n;
	return 1;
}

static void tap_check_drops(int fd)
{
	struct tpacket_stats st;
	socklen_t sl = sizeof(st);

	if (getsockopt(fd, SOL_PACKET, PACKET_STATISTICS, &st, &sl) < 0)
		die(3, "PACKET_STATISTICS: %s", strerror(errno));
	if (st.tp_drops)
		die(3, "the tap dropped %u frames", st.tp_drops);
}

/* Await the tap's copy of every frame sent in burst b (frames[0..count)); each is
 * stamped with its departure, monotonic. */
static void tap_collect(int fd, uint16_t sport, uint16_t dport, uint32_t b,
			struct frame *frames, uint32_t count, int64_t offset)
{
	uint32_t want = 0, seen = 0;
	int64_t deadline = now_ns(CLOCK_MONOTONIC) + 2000000000LL;

	for (uint32_t i = 0; i < count; i++)
		want += frames[i].sent;
	while (seen < want) {
		struct tag tag;
		uint32_t len;
		int64_t real;
		int r = tap_read(fd, sport, dport, &tag, &len, &real);

		if (r < 0) {
			struct pollfd p = { fd, POLLIN, 0 };

			if (now_ns(CLOCK_MONOTONIC) > deadline)
				die(3, "burst %u: the tap saw %u of the %u frames sent", b, seen, want);
			poll(&p, 1, 100);
			continue;
		}
		if (!r || tag.burst == WARMUP)
			continue;
		if (tag.burst != b || tag.frame >= count || !frames[tag.frame].sent ||
		    frames[tag.frame].stamp)
			die(3, "burst %u: unexpected frame %u of burst %u on the tap", b, tag.frame,
			    tag.burst);
		struct frame *f = &frames[tag.frame];

		f->stamp = real - offset;
		f->len = len;
		if (f->stamp < f->before - STAMP_SLACK_NS || f->stamp > f->after + STAMP_SLACK_NS)
			die(3, "burst %u frame %u: tap stamp %" PRId64 " outside its send call "
			    "[%" PRId64 ", %" PRId64 "] (a queue on the interface, or a clock step)",
			    b, tag.frame, f->stamp, f->before, f->after);
		seen++;
	}
	tap_check_drops(fd);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "dst", required_argument, 0, 'd' }, { "port", required_argument, 0, 'p' },
		{ "rate", required_argument, 0, 'r' }, { "frame", required_argument, 0, 'f' },
		{ "bursts", required_argument, 0, 'b' }, { "gap-ms", required_argument, 0, 'g' },
		{ "tap", required_argument, 0, 't' }, { "cpu", required_argument, 0, 'c' },
		{ 0, 0, 0, 0 },
	};
	const char *dst = NULL, *bursts = "1000,200", *tapif = NULL;
	int port = 9, frame_len = 4042, cpu = -1, opt, fd, tap = -1;
	int64_t rate = 1000000000, gap_ns = 30000000;
	struct sockaddr_in sin = { .sin_family = AF_INET }, me;
	socklen_t melen = sizeof(me);
	int sndbuf = 4 << 20;

	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'd': dst = optarg; break;
		case 'p': port = atoi(optarg); break;
		case 'r': rate = parse_rate(optarg); break;
		case 'f': frame_len = atoi(optarg); break;
		case 'b': bursts = optarg; break;
		case 'g': gap_ns = (int64_t)(atof(optarg) * 1e6); break;
		case 't': tapif = optarg; break;
		case 'c': cpu = atoi(optarg); break;
		default: die(2, "usage: burstgen --dst ADDR [--port P] [--rate R] [--frame B] "
			     "[--bursts US,US..] [--gap-ms MS] [--tap IFNAME] [--cpu N]");
		}
	}
	if (!dst || inet_pton(AF_INET, dst, &sin.sin_addr) != 1)
		die(2, "--dst must be an IPv4 address");
	if (frame_len < HEADERS + (int)sizeof(struct tag) || port <= 0 || port > 65535)
		die(2, "--frame must be at least %zu bytes", HEADERS + sizeof(struct tag));
	sin.sin_port = htons((uint16_t)port);

	if (cpu >= 0) {
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		sched_setaffinity(0, sizeof(set), &set);
	}
	struct sched_param sp = { .sched_priority = 10 };

	sched_setscheduler(0, SCHED_FIFO, &sp);
	mlockall(MCL_CURRENT | MCL_FUTURE);

	fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0)
		die(3, "socket: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
	/* bound, not connected: the peer's port unreachable replies must not fail sends */
	me = (struct sockaddr_in){ .sin_family = AF_INET };
	if (bind(fd, (struct sockaddr *)&me, sizeof(me)) < 0 ||
	    getsockname(fd, (struct sockaddr *)&me, &melen) < 0)
		die(3, "bind: %s", strerror(errno));
	if (tapif)
		tap = open_tap(tapif);

	size_t plen = (size_t)frame_len - HEADERS;
	unsigned char *payload = calloc(1, plen);
	struct tag *tag = (struct tag *)payload;

	if (!payload)
		die(3, "out of memory");

	tag->magic = MAGIC;
	tag->burst = WARMUP;
	/* The first sends on a fresh socket are slow (route and neighbour lookups, buffer
	 * and page allocations), and the tap's stamps are switched on by deferred work:
	 * warm-up frames keep both out of the first burst. */
	for (int k = 0; k < 3; k++) {
		sleep_until(now_ns(CLOCK_MONOTONIC) + gap_ns);
		if (sendto(fd, payload, plen, 0, (struct sockaddr *)&sin, sizeof(sin)) < 0)
			die(3, "send: %s", strerror(errno));
	}
	int64_t interval_x = (int64_t)frame_len * 8 * 1000000000;  /* interval = this / rate */
	uint32_t b = 0;

	for (const char *p = bursts; *p; b++) {
		char *end;
		long us = strtol(p, &end, 10);

		if (end == p || us <= 0)
			die(2, "bad --bursts %s", bursts);
		p = *end == ',' ? end + 1 : end;
		double interval = (double)interval_x / (double)rate;
		uint32_t count = (uint32_t)(us * 1000.0 / interval + 0.5);

		if (!count)
			count = 1;
		struct frame *frames = calloc(count, sizeof(*frames));

		if (!frames)
			die(3, "out of memory");
		tag->burst = b;
		int64_t planned = now_ns(CLOCK_MONOTONIC) + gap_ns;

		sleep_until(planned - SPIN_NS);
		int64_t offset = real_minus_mono();
		int64_t t0 = now_ns(CLOCK_MONOTONIC);

		/* woken late, the burst starts now, paced from its first frame (no catch-up rush) */
		if (t0 < planned)
			t0 = planned;
		for (uint32_t i = 0; i < count; i++) {
			int64_t due = t0 + (int64_t)i * interval_x / rate, t;

			while ((t = now_ns(CLOCK_MONOTONIC)) < due)
				;
			tag->frame = i;
			frames[i].before = t;
			frames[i].sent = sendto(fd, payload, plen, 0, (struct sockaddr *)&sin,
						sizeof(sin)) >= 0;
			frames[i].after = now_ns(CLOCK_MONOTONIC);
		}
		if (tap >= 0) {
			tap_collect(tap, ntohs(me.sin_port), (uint16_t)port, b, frames, count, offset);
		} else {
			for (uint32_t i = 0; i < count; i++) {
				frames[i].stamp = frames[i].sent ? frames[i].before : 0;
				frames[i].len = (uint32_t)frame_len;
			}
		}
		int64_t start = 0, last = 0, max_gap = 0, bytes = 0;
		uint32_t packets = 0;

		for (uint32_t i = 0; i < count; i++) {
			if (!frames[i].sent)
				continue;
			if (!packets)
				start = frames[i].stamp;
			else if (frames[i].stamp - last > max_gap)
				max_gap = frames[i].stamp - last;
			last = frames[i].stamp;
			bytes += frames[i].len;
			packets++;
		}
		printf("{\"start_ns\": %" PRId64 ", \"end_ns\": %" PRId64 ", \"bytes\": %" PRId64
		       ", \"packets\": %u, \"planned_us\": %ld, \"max_gap_ns\": %" PRId64
		       ", \"departures_ns\": [", start, last, bytes, packets, us, max_gap);
		for (uint32_t i = 0, n = 0; i < count; i++)
			if (frames[i].sent)
				printf("%s%" PRId64, n++ ? ", " : "", frames[i].stamp - start);
		printf("], \"sent_ns\": [");
		for (uint32_t i = 0, n = 0; i < count; i++)
			if (frames[i].sent)
				printf("%s%" PRId64, n++ ? ", " : "", frames[i].before - start);
		printf("]}\n");
		fflush(stdout);
		free(frames);
	}
	close(fd);
	if (tap >= 0)
		close(tap);
	return 0;
}
