"""Agent configuration (see fabricscope.config for how it is loaded)."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field

from fabricscope.config import doc
from fabricscope.errors import UserError

#: config tc_attach (agent/tc.py)
TC_ATTACH_MODES = ("auto", "tcx", "clsact")


#: Every probe that needs no extra input. Those whose library or interface is
#: absent attach nothing and cost a /proc rescan every few seconds.
DEFAULT_PROBES = ("tcp_flows", "nic", "markers", "gloo", "nccl")


@dataclass
class AgentConfig:
    """Configuration of the per-node agent (`fabricscope agent`)."""

    node: str = field(default_factory=socket.gethostname,
                      metadata=doc("node name put on every record", default_doc="<hostname>"))
    collector: str = field(default="", metadata=doc(
        "collector address host:port; empty: ship nothing (use with --output jsonl)"))
    output: str = field(default="none", metadata=doc(
        "also print every record as one JSON object per line on stdout: jsonl or none",
        choices=["none", "jsonl"]))
    probes: list[str] = field(default_factory=lambda: list(DEFAULT_PROBES),
                              metadata=doc("probes and sources to run (tcp_flows includes "
                                           "tcp_retransmit: enable one of the two; nccl_log "
                                           "needs nccl_log_paths, nccl_inspector "
                                           "nccl_inspector_dir, nccl_ras nccl_ras_address; "
                                           "synthetic is a load "
                                           "generator for tests)",
                                           default_doc=list(DEFAULT_PROBES)))
    addresses: list[str] = field(default_factory=list, metadata=doc(
        "IP addresses that belong to this node (events are attributed by them); "
        "empty: every address of the agent's network namespace"))
    markers_dir: str = field(default="/run/fabricscope/markers", metadata=doc(
        "directory where training processes write marker rings (FABRICSCOPE_MARKERS_DIR)"))
    nccl_paths: list[str] = field(default_factory=list, metadata=doc(
        "NCCL library files the nccl probe attaches to at start (e.g. "
        "/usr/lib/x86_64-linux-gnu/libnccl.so.2), so every call of a process started later "
        "is seen from its first one; libraries that running processes map are found "
        "without this (rescanned every 2 s)"))
    nccl_log_paths: list[str] = field(default_factory=list, metadata=doc(
        "NCCL_DEBUG=INFO output the nccl_log source follows: files, glob patterns (new "
        "matches are picked up) or - for stdin; empty: the source has nothing to read"))
    # --- NCCL's own evidence: profiler plugin rings, Inspector dumps, RAS ---
    ncclprof_dir: str = field(default="/dev/shm", metadata=doc(
        "directory where fabricscope's NCCL profiler plugin writes its rings (the training "
        "pods' FABRICSCOPE_NCCLPROF_DIR; probe ncclprof, docs/nccl-profiler.md)"))
    nccl_inspector_dir: str = field(default="", metadata=doc(
        "NCCL Inspector's JSON dump directory (the training job's NCCL_INSPECTOR_DUMP_DIR) "
        "the nccl_inspector source follows; empty: the source has nothing to read"))
    nccl_ras_address: str = field(default="", metadata=doc(
        "host:port of NCCL's RAS service (NCCL_RAS_ADDR, port 28028) the nccl_ras source "
        "queries for the job's rank health; empty: off"))
    nccl_ras_interval_s: float = field(default=10.0, metadata=doc(
        "seconds between nccl_ras status queries (each asks every rank of the job; RAS "
        "may take up to 10 s to answer)"))
    nccl_ras_job: str = field(default="", metadata=doc(
        "job tag of the nccl_ras records; empty: the job of a local rank RAS lists (its "
        "environment), else ras:<address>"))
    # --- probe gloo (agent/probes/gloo/probe.py) ---
    gloo_paths: list[str] = field(default_factory=list, metadata=doc(
        "libtorch_cpu.so files (gloo is linked into it) the gloo probe attaches to at start, "
        "so a process started later is seen from its first collective; the torch of the "
        "agent's own Python is always attached, and files that running processes map are "
        "found without this (rescanned every 2 s)"))
    gloo_model_window_s: float = field(default=10.0, metadata=doc(
        "seconds of collective traffic each traffic_model record (T, B, D) is fitted to"))
    gloo_model_interval_s: float = field(default=5.0, metadata=doc(
        "how often the gloo probe writes a traffic_model record per training process (and "
        "once more when the process exits, over its last window)"))
    gloo_buffer_hooks: bool = field(default=False, metadata=doc(
        "also hook gloo's UnboundBuffer::send/recv: per collective the payload sent and "
        "posted and the send calls (sent_bytes, recv_bytes, sends), S from the transfers "
        "where the options cannot be read, wire_efficiency, and the payload as the "
        "traffic_model series (without them: the ring model's bytes). "
        "Off by default: each hook is a uprobe trap in a rank's thread, about 30 per step "
        "and rank in a DDP job, and in the lab they were the largest cost the agents put "
        "on the step time (docs/PERFORMANCE.md: ddp-overhead about 1.07 with them, 1.05 "
        "without). Without them: collectives (S from their options), steps and phases"))
    kernel_headers: str = field(default="", metadata=doc(
        "kernel headers directory for BCC; empty: the running kernel's, else the "
        "distribution's linux-headers package"))
    poll_interval_s: float = field(default=1.0, metadata=doc(
        "how often probes are drained into records. Each poll costs the agent CPU "
        "whatever it finds (docs/PERFORMANCE.md: 1.0 s instead of 0.2 s takes the DDP "
        "overhead from 1.14 to 1.08); what the kernel aggregates keeps its own "
        "resolution (100 us NIC bins, exact event timestamps) at any interval. BPF "
        "ring buffers are sized to hold one interval. The agent polls more often where "
        "the NIC probe's rings (a region per CPU) would otherwise exceed 128 MiB (many "
        "CPUs and interfaces), and says so in its log. Polls run 20 ms after each "
        "multiple of the interval on the wall clock (fabricscope/cadence.py), so that "
        "a second's records of every probe and node leave together, just after it"))
    nice: int = field(default=10, metadata=doc(
        "CPU priority (nice, 0..19) the agent drops to once its probes are attached, so "
        "that training threads get the CPU first (a rank delayed by the agent delays every "
        "rank at the next collective). Kernel maps buffer several poll intervals, so a late "
        "poll loses nothing; what a far-too-late one loses is counted "
        "(fabricscope_agent_events_lost_total). 0 keeps the priority it started with. "
        "One thread keeps it anyway: the gloo probe's watcher, which wakes 20 times a "
        "second to read a new rank's identity while the rank lives"))
    cpu_policy: str = field(default="normal", metadata=doc(
        "scheduling policy the agent takes once attached: normal (at `nice`) or idle "
        "(SCHED_IDLE: it runs only on CPU time nothing else wants, so training never "
        "waits for it; on a node whose CPUs are all busy its drains fall behind, and what "
        "kernel maps then overwrite is counted)"))
    batch_max_records: int = field(default=5000, metadata=doc("most records in one batch"))
    flush_interval_s: float = field(default=0.2, metadata=doc(
        "longest time a record waits before its batch is sent: a poll's records go out "
        "together as one batch shortly after the poll (the diagnosis engine's latency "
        "includes this wait)"))
    queue_max_records: int = field(default=200_000, metadata=doc(
        "records of unacknowledged batches kept in memory: with spool_dir a cache (the "
        "others are read back from disk when sent); without, the cap (when full the oldest "
        "batches are dropped, counted and reported as agent_loss)"))
    shutdown_timeout_s: float = field(default=5.0, metadata=doc(
        "on SIGTERM/SIGINT, longest wait for queued batches to be acknowledged (what is "
        "left stays in spool_dir for the next start)"))
    # --- transport to the collector (agent/shipper.py, agent/spool.py) ---
    spool_dir: str = field(default="/var/lib/fabricscope/spool/{node}", metadata=doc(
        "directory where batches wait, fsynced, until the collector acknowledges them, so "
        "that a collector outage or an agent restart loses nothing ({node} is replaced by "
        "the node name); one directory per agent (it is locked); empty: memory only "
        "(queue_max_records)"))
    spool_max_bytes: int = field(default=512 * 1024 * 1024, metadata=doc(
        "cap of the spool on disk; when full the oldest batches are dropped, counted "
        "(records_dropped_total{reason=\"spool_full\"}) and reported as agent_loss"))
    batch_max_bytes: int = field(default=4 * 1024 * 1024, metadata=doc(
        "largest serialized batch; bigger ones are split (keep it below the collector's "
        "max_message_bytes)"))
    compression: str = field(default="gzip", metadata=doc(
        "gRPC message compression of batches: gzip or none", choices=["gzip", "none"]))
    token: str = field(default="", metadata=doc(
        "bearer token presented to the collector (never logged; prefer token_file or the "
        "environment: flags are visible in the process list)"))
    token_file: str = field(default="", metadata=doc("file holding the bearer token"))
    tls: bool = field(default=False, metadata=doc(
        "connect with TLS (implied by tls_ca and tls_cert); without tls_ca the system's "
        "trusted roots verify the collector"))
    tls_ca: str = field(default="", metadata=doc("PEM CA bundle that signed the collector's "
                                                 "certificate"))
    tls_cert: str = field(default="", metadata=doc(
        "PEM client certificate for mutual TLS (with tls_key)"))
    tls_key: str = field(default="", metadata=doc("PEM private key of tls_cert (never logged)"))
    tls_server_name: str = field(default="", metadata=doc(
        "name to verify in the collector's certificate when it differs from the host in "
        "`collector` (e.g. connecting by IP address)"))
    # --- source synthetic (agent/sources/synthetic.py): a load generator ---
    synthetic_rate: float = field(default=1000.0, metadata=doc(
        "synthetic source: records per second"))
    synthetic_count: int = field(default=0, metadata=doc(
        "synthetic source: stop after this many records (0: never)"))
    metrics_host: str = field(default="0.0.0.0", metadata=doc("address for /metrics and /readyz"))
    metrics_port: int = field(default=9471, metadata=doc("port for /metrics and /readyz; 0 picks one"))
    # --- probes tcp_retransmit and tcp_flows (agent/probes/tcp_*.py) ---
    tcp_window_s: float = field(default=1.0, metadata=doc(
        "tcp_flows aggregation window in seconds: one tcp_flow record per flow with traffic "
        "and one tcp_node record per window (at least poll_interval_s)"))
    tcp_max_flows: int = field(default=4096, metadata=doc(
        "flows tcp_flows aggregates at once (per-CPU LRU hash, 464 bytes per flow and CPU, "
        "shrunk with a log line to fit 256 MiB; when full the least recently active are "
        "evicted and the window is counted in probe_events_total{event=\"flow_table_full\"})"))
    tcp_transfer_gap_us: int = field(default=2000, metadata=doc(
        "tcp_flows transfers: a gap in a socket's traffic longer than this ends one "
        "transfer (a tcp_transfer record: start, length, bytes each way) and the next "
        "segment starts another (100..1000000)"))
    tcp_transfer_min_bytes: int = field(default=65536, metadata=doc(
        "transfers moving fewer bytes (in + out) are only counted "
        "(probe_events_total{event=\"transfers_small\"}), not reported: bulk transfers "
        "(data loading, checkpoints, collectives) stay, chatter does not"))
    tcp_transfer_tail_us: int = field(default=20000, metadata=doc(
        "a transfer under tcp_transfer_min_bytes is still reported when it began at most "
        "this long after the flow's previous reported transfer ended: the rest of a bulk "
        "transfer that a stall (a descheduled sender or reader) split keeps its bytes "
        "(counted as probe_events_total{event=\"transfers_tail\"}), and a training rank's "
        "piece under 64 KiB that soon after keeps the phase of the transfer before (a "
        "store's late acknowledgment of a checkpoint is no read); 0 turns both off "
        "(0..10000000)"))
    tcp_transfers_per_s: int = field(default=200, metadata=doc(
        "tcp_transfer records written per second at most for processes that are not "
        "training ranks (a busy storage or web server makes thousands); the rest are "
        "counted (probe_events_total{probe=\"join\",event=\"transfers_unlisted\"}). A "
        "training rank's transfers are always written, with their phase"))
    tcp_rx_info: bool = field(default=True, metadata=doc(
        "tcp_flows: at each window cut read every connected TCP socket's tcp_info "
        "(sock_diag, as `ss -ti`) for the receive-side fields of tcp_flow (rx_data_segs, "
        "rx_ooo_pkts, rcv_rtt_us): the loss of flows whose sender runs no agent, such as "
        "a storage read through a lossy ToR downlink. Costs about 6 ms of CPU per 1,000 "
        "sockets per window (0.004 CPU-s/s per agent in agent-footprint); false turns "
        "it off"))
    tcp_flow_hooks: list[str] = field(
        default_factory=lambda: ["tcp/tcp_probe", "sock/inet_sock_set_state",
                                 "tcp/tcp_send_reset", "tcp/tcp_receive_reset"],
        metadata=doc("tracepoints tcp_flows hooks besides the retransmit ones: tcp/tcp_probe "
                     "(RTT, cwnd, bytes; runs per segment received), sock/inet_sock_set_state "
                     "(opens, closes), tcp/tcp_send_reset, tcp/tcp_receive_reset; one this "
                     "kernel lacks makes the probe unavailable (logged; the agent runs on)",
                     default_doc=["tcp/tcp_probe", "sock/inet_sock_set_state",
                                  "tcp/tcp_send_reset", "tcp/tcp_receive_reset"]))
    tc_attach: str = field(default="auto", metadata=doc(
        "how the nic and tcp_retransmit probes hook TC: tcx (BPF links, Linux 6.6+; no "
        "qdisc or classifier in between, cheaper per packet), clsact (cls_bpf filters, any "
        "kernel with clsact), auto: tcx, else clsact (logged)",
        choices=list(TC_ATTACH_MODES)))
    # --- Kubernetes pods and jobs (agent/kube/) ---
    kube_pods: str = field(default="auto", metadata=doc(
        "where the node's pod list comes from, so that records carry namespace, pod and the "
        "training job of the pod's labels: apiserver (GET /api/v1/pods of this node; RBAC "
        "pods list), kubelet (GET /pods; RBAC nodes/proxy), off, or auto: apiserver inside "
        "a pod (KUBERNETES_SERVICE_HOST set), else off. Relisted in a thread of its own; "
        "while unreachable records flow without those tags (one log line, failures counted "
        "in probe_events_total{probe=\"kube\"})", choices=["auto", "apiserver", "kubelet", "off"]))
    kube_url: str = field(default="", metadata=doc(
        "base URL of the pod list's source; empty: https://$KUBERNETES_SERVICE_HOST:"
        "$KUBERNETES_SERVICE_PORT (apiserver) or https://127.0.0.1:10250 (kubelet, with "
        "hostNetwork). The node's pods are those whose spec.nodeName is config `node`"))
    kube_token_file: str = field(
        default="/var/run/secrets/kubernetes.io/serviceaccount/token", metadata=doc(
            "bearer token presented to the API server or kubelet (read at each relist: "
            "projected tokens rotate)"))
    kube_ca_file: str = field(
        default="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", metadata=doc(
            "PEM CA that signed the API server's (or kubelet's) serving certificate"))
    kube_insecure_tls: bool = field(default=False, metadata=doc(
        "do not verify the serving certificate (a kubelet whose certificate is self-signed)"))
    kube_relist_s: float = field(default=10.0, metadata=doc(
        "seconds between relists of the pod list (sooner, at most once a second, when a "
        "process's pod is missing from it; backoff from 1 s to 60 s while unreachable)"))
    kube_job_labels: list[str] = field(default_factory=list, metadata=doc(
        "pod label keys naming the training job, tried before the built-in ones "
        "(training.kubeflow.org/job-name, jobset.sigs.k8s.io/jobset-name, volcano.sh/job-name, "
        "leaderworkerset.sigs.k8s.io/name, batch.kubernetes.io/job-name, job-name)"))
    # --- probe nic (agent/probes/nic/probe.py) ---
    interfaces: list[str] = field(default_factory=list, metadata=doc(
        "interfaces the nic probe watches (TC ingress and egress); empty: every "
        "non-loopback interface that is up in the agent's network namespace at start"))
    nic_bin_us: int = field(default=100, metadata=doc(
        "nic probe time bin in microseconds (10..10000): the resolution of rates and bursts"))
    nic_window_s: float = field(default=1.0, metadata=doc(
        "nic probe aggregation window in seconds (a multiple of the bin): one nic_window "
        "and one nic_flow record per interface, direction (and flow) per window"))
    nic_burst_threshold: float = field(default=0.5, metadata=doc(
        "utilization (0..1] of the link speed above which a bin is hot; consecutive hot "
        "bins form a burst"))
    nic_bursts_per_window: int = field(default=16, metadata=doc(
        "nic_burst records per interface, direction and window at most: the largest bursts "
        "(by bytes) that started in the window; nic_window counts them all (bursts, "
        "bursts_listed). Bounds the records a busy link makes (a DDP job: hundreds of bursts "
        "per second); 0 lists none"))
    link_speed_bps: list[str] = field(default_factory=list, metadata=doc(
        "line rates for utilization and bursts: IF=RATE entries (e.g. eth0=25gbit) override "
        "what the kernel reports; a bare RATE applies where the kernel reports none or the "
        "link is virtual (veth, bridge, tun: no line rate); none: utilization is left out"))
    nic_max_flows: int = field(default=8192, metadata=doc(
        "flows the nic probe tracks at once (per-CPU LRU hash; the least recently seen are "
        "evicted and counted)"))

    def check(self) -> None:
        if self.tc_attach not in TC_ATTACH_MODES:
            raise UserError(f"tc_attach {self.tc_attach!r} is not a TC attach mode",
                            f"give one of {', '.join(TC_ATTACH_MODES)}")
        if self.output not in ("none", "jsonl"):
            raise UserError(f"--output must be jsonl or none, not {self.output!r}",
                            "use --output jsonl")
        if self.collector and not self.collector.rpartition(":")[2].isdigit():
            raise UserError(f"collector address {self.collector!r} has no port",
                            "give host:port, e.g. --collector 198.18.0.254:9470")
        if self.batch_max_records < 1 or self.flush_interval_s <= 0 or self.poll_interval_s <= 0:
            raise UserError("batch size and intervals must be positive", "see docs/config.md")
        if self.queue_max_records < self.batch_max_records:
            raise UserError(f"queue_max_records {self.queue_max_records} is smaller than one "
                            f"batch ({self.batch_max_records})",
                            "raise --queue-max-records or lower --batch-max-records")
        if self.shutdown_timeout_s < 0:
            raise UserError("shutdown_timeout_s must not be negative", "use 0 or more")
        if not 0 <= self.nice <= 19:
            raise UserError(f"nice {self.nice} is outside 0..19", "give e.g. --nice 10")
        if self.cpu_policy not in ("normal", "idle"):
            raise UserError(f"cpu_policy {self.cpu_policy!r} is not normal or idle",
                            "give --cpu-policy normal or --cpu-policy idle")
        self.check_transport()
        if not 0 <= self.metrics_port <= 65535:
            raise UserError(f"metrics port {self.metrics_port} is out of range",
                            "use 1-65535, or 0 to pick a free one")
        from fabricscope.agent.probes import REGISTRY
        unknown = [p for p in self.probes if p not in REGISTRY]
        if unknown or not self.probes:
            raise UserError(f"unknown probe {', '.join(unknown)!s}" if unknown
                            else "no probe enabled",
                            f"choose from {', '.join(sorted(REGISTRY))}")
        self.check_tcp()
        if self.kube_pods not in ("auto", "apiserver", "kubelet", "off"):
            raise UserError(f"kube_pods {self.kube_pods!r} is not a pod list source",
                            "give auto, apiserver, kubelet or off")
        if not self.kube_relist_s > 0:
            raise UserError(f"kube_relist_s {self.kube_relist_s:g} is not positive",
                            "give e.g. --kube-relist-s 10")
        from fabricscope.agent.addresses import parse_addresses
        parse_addresses(self.addresses)

    def check_transport(self) -> None:
        if self.compression not in ("gzip", "none"):
            raise UserError(f"compression must be gzip or none, not {self.compression!r}",
                            "use --compression gzip")
        if self.token and self.token_file:
            raise UserError("both token and token_file are set", "keep one of them")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise UserError("tls_cert and tls_key must be given together",
                            "set both --tls-cert and --tls-key, or neither")
        if self.batch_max_bytes < 1024:
            raise UserError(f"batch_max_bytes {self.batch_max_bytes} is too small",
                            "use at least 1024 (default 4 MiB)")
        if self.spool_dir and self.spool_max_bytes < 2 * self.batch_max_bytes:
            raise UserError(f"spool_max_bytes {self.spool_max_bytes} holds less than two "
                            f"batches of batch_max_bytes {self.batch_max_bytes}",
                            "raise --spool-max-bytes or lower --batch-max-bytes")
        if self.synthetic_rate <= 0 or self.synthetic_count < 0:
            raise UserError("synthetic_rate must be positive and synthetic_count not negative",
                            "e.g. --synthetic-rate 1000 --synthetic-count 0")

    def check_tcp(self) -> None:
        from fabricscope.agent.probes import INCLUDES
        for probe, included in INCLUDES.items():
            both = [p for p in included if p in self.probes and probe in self.probes]
            if both:
                raise UserError(f"probe {probe} includes {', '.join(both)}; both are enabled",
                                f"list only {probe} in --probes")
        if self.tcp_window_s < self.poll_interval_s:
            raise UserError(f"tcp_window_s {self.tcp_window_s:g} is shorter than "
                            f"poll_interval_s {self.poll_interval_s:g}",
                            "give a window of at least one poll interval, e.g. 1")
        if not 64 <= self.tcp_max_flows <= 1 << 20:
            raise UserError(f"tcp_max_flows {self.tcp_max_flows} is out of range",
                            "give 64 to 1048576 (default 4096)")
        if not 100 <= self.tcp_transfer_gap_us <= 1_000_000:
            raise UserError(f"tcp_transfer_gap_us {self.tcp_transfer_gap_us} is outside "
                            "100..1000000", "give e.g. --tcp-transfer-gap-us 2000")
        if self.tcp_transfers_per_s < 0:
            raise UserError(f"tcp_transfers_per_s {self.tcp_transfers_per_s} is negative",
                            "give 0 or more, e.g. --tcp-transfers-per-s 200")
        if not 0 <= self.tcp_transfer_tail_us <= 10_000_000:
            raise UserError(f"tcp_transfer_tail_us {self.tcp_transfer_tail_us} is out of "
                            "range", "give 0..10000000 (0: report no transfer under "
                            "tcp_transfer_min_bytes)")
        if not 1 <= self.tcp_transfer_min_bytes <= 1 << 40:
            raise UserError(f"tcp_transfer_min_bytes {self.tcp_transfer_min_bytes} is out of "
                            "range", "give 1 or more, e.g. --tcp-transfer-min-bytes 65536")
        bad = [h for h in self.tcp_flow_hooks if not re.fullmatch(r"\w+/\w+", h)]
        if bad:
            raise UserError(f"tcp_flow_hooks: {bad[0]!r} is not CATEGORY/EVENT",
                            "name tracepoints like tcp/tcp_probe")

    def spool_path(self) -> str:
        """spool_dir with {node} replaced; empty: memory only."""
        return self.spool_dir.replace("{node}", self.node.replace("/", "_"))

    def uses_tls(self) -> bool:
        return bool(self.tls or self.tls_ca or self.tls_cert)
