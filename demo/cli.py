"""`fabricscope demo`: the whole story on this one machine, for real.

1. a 3-node lab (namespaces, veths, a bridge as the top-of-rack switch),
2. a real InfluxDB, the collector, and one agent per node inside its namespace,
3. real PyTorch DDP training over gloo, each rank reading a batch from a data
   server every step and writing a checkpoint every few steps; halfway through,
   random loss on one node's switch port,
4. a plain summary of what reached InfluxDB per node (retransmits against the
   kernel's own counters, step times before and after the fault, and where the
   time went: gradient sync, with the retransmits inside it, against data loading),
5. what the collector's diagnosis engine found (cause, place, impact, evidence,
   advice) and a before/after comparison around the fault's annotation,
6. an HTML report of the run and where the Grafana provisioning files are,
7. everything torn down, also on failure or Ctrl-C.
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from fabricscope.errors import UserError


def register(sub) -> None:
    p = sub.add_parser("demo", help="end-to-end run on this machine: lab, agents, collector, "
                                    "InfluxDB, DDP training with a fault halfway",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=3, help="lab nodes = DDP ranks (default 3)")
    p.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    p.add_argument("--model-mb", type=float, default=8, help="model parameter MiB (default 8)")
    p.add_argument("--fault-node", type=int, default=1, help="node whose port loses packets")
    p.add_argument("--loss", type=float, default=2.0, help="loss percent switched on halfway")
    p.add_argument("--name", default="demo", help="lab name (default demo)")
    p.add_argument("--data-mb", type=float, default=1.0,
                   help="MiB each rank reads from the data server per step (default 1; 0: none)")
    p.add_argument("--checkpoint-every", type=int, default=10,
                   help="steps between checkpoint writes (default 10; 0: none)")
    p.add_argument("--report", default="fabricscope-demo-report.html",
                   help="where the HTML report of the run goes (default "
                        "./fabricscope-demo-report.html)")
    p.add_argument("--gso", action="store_true",
                   help="let the veths carry 64 KB GSO packets (faster, but loss then drops "
                        "whole bursts instead of wire-sized frames as a switch would)")
    p.set_defaults(func=run)


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(args) -> int:
    if args.nodes < 2 or args.steps < 4 or not 0 <= args.fault_node < args.nodes:
        raise UserError("demo needs --nodes >= 2, --steps >= 4 and a --fault-node within the lab",
                        "e.g. fabricscope demo --nodes 3 --steps 40 --fault-node 1")
    if args.data_mb < 0 or args.checkpoint_every < 0:
        raise UserError("--data-mb and --checkpoint-every must be 0 or more",
                        "e.g. --data-mb 1 --checkpoint-every 10")
    from fabricscope.lab.stack import await_stable, nstat_counter, running_stack
    from fabricscope.demo.findings import report, where_grafana, write_report
    from fabricscope.diagnosis.store import Store
    from fabricscope.records import Record
    from fabricscope.lab.dataserver import running_dataserver
    from fabricscope.lab.faults import loss
    from fabricscope.lab.running import running_lab
    from fabricscope.lab.training import start_training

    say(f"building lab {args.name!r}: {args.nodes} nodes on one bridge")
    # wire_frames: one 1500-byte frame per skb on the lab's links, so the loss fault
    # drops frames the way a switch port does.
    with running_lab(args.name, args.nodes, wire_frames=not args.gso) as lab, \
            running_dataserver(lab, None) as data_server:
        for node in lab.nodes:
            say(f"  node{node.index}: netns {node.netns}, nic {node.ifname}, {node.address}")
        say(f"  data server (dataset and checkpoint store) at {data_server}, behind the bridge")
        say("starting InfluxDB, the collector and one agent per node (BPF compile included)")
        with running_stack(lab) as stack:
            say(f"  collector at {stack.collector_addr}, InfluxDB at {stack.influx.url}; "
                f"{len(stack.agents)} agents ready")
            before = {n.index: nstat_counter(n.netns) for n in lab.nodes}
            half = args.steps // 2
            say(f"training: {args.steps} DDP steps over gloo, {args.model_mb:g} MiB model, "
                f"{args.data_mb:g} MiB read per step, a checkpoint every "
                f"{args.checkpoint_every} steps; {args.loss:g}% loss on "
                f"node{args.fault_node}'s port from step {half}")
            steps: list[dict] = []
            io = dict(data_server=data_server, data_bytes=int(args.data_mb * 2**20),
                      checkpoint_every=args.checkpoint_every) \
                if args.data_mb or args.checkpoint_every else {}
            store = Store(stack.influx.url)
            port = random.randint(20000, 39999)
            job = f"{lab.nodes[0].address}:{port}"
            fault_text = f"{args.loss:g}% loss on node{args.fault_node}'s port"
            start_ns = fault_ns = time.time_ns()
            with start_training(lab, args.steps, model_mb=args.model_mb, master_port=port,
                                **io) as training:
                for row in training.steps():
                    steps.append(row)
                    if row["step"] == 0:
                        start_ns = time.time_ns()
                    if row["step"] == half - 1:
                        loss(lab, args.fault_node, args.loss)
                        fault_ns = time.time_ns()
                        store.write([Record("annotation", fault_ns, {"job": job}, {
                            "text": fault_text, "author": "fabricscope demo"})])
                        say(f"  fault on: {args.loss:g}% loss on node{args.fault_node}")
                    if row["step"] % 5 == 0 or row["step"] == args.steps - 1:
                        say(f"  step {row['step']:>3}: {row['seconds']:.3f} s")
                training.wait()
            end_ns = time.time_ns()
            # closing connections may still retransmit: take the counts once settled
            after = await_stable(lambda: {n.index: nstat_counter(n.netns) for n in lab.nodes},
                                 quiet_s=2.0, timeout_s=60, what="the kernel's counters")
            # the records to compare end here: the demo's own traffic after it (metric
            # scrapes, the agents' shipping) still crosses the lossy link and retransmits
            read_ns = time.time_ns()
            say("waiting for the agents to ship everything to InfluxDB")
            summary = collect_summary(stack, lab, args.steps, before, after, read_ns)
            verdict = report(store, job, start_ns, fault_ns, end_ns)
            report_path = write_report(store, job, start_ns, time.time_ns(), fault_text,
                                       args.report)
        print_summary(summary, steps, half, args)
        print(verdict)
        print(f"HTML report of the run: {report_path}  (opens offline)")
        print(f"Grafana: point a Grafana server at {where_grafana()} "
              "(datasources and dashboards; see grafana/README.md)")
    say("lab torn down; done")
    return 0


def collect_summary(stack, lab, steps: int, before: dict, after: dict, read_ns: int) -> dict:
    """What reached InfluxDB; retransmits up to read_ns, when the kernel's counters
    (`after`) were read, so both count the same span."""
    from fabricscope.lab.stack import await_condition, await_stable
    influx = stack.influx

    def count(query: str) -> int:
        rows = influx.query(query, db="fabricscope")
        return int(rows[0]["count"]) if rows else 0

    def retransmits(name: str) -> int:
        rows = influx.query(f"SELECT sum(segs) FROM tcp_retransmit WHERE node='{name}' "
                            f"AND time <= {read_ns}", db="fabricscope")
        return int(rows[0]["sum"]) if rows else 0

    def steps_landed():
        return count("SELECT count(seconds) FROM train_step WHERE rank='0'") >= steps - 1
    await_condition(steps_landed, 60, "rank 0's step records in InfluxDB", interval_s=0.5)
    await_condition(lambda: all(stack.agent_metric(n.index, "fabricscope_agent_queue_records")
                                == 0 for n in lab.nodes), 60, "the agents' queues to drain")
    names = [f"node{n.index}" for n in lab.nodes]
    stored = dict(zip(names, await_stable(lambda: [retransmits(n) for n in names], quiet_s=3.0,
                                          timeout_s=60, what="retransmits in InfluxDB")))
    # phases wait in the agents' join for partners (2 s) and the last transfers end
    # when the ranks close their connections
    await_stable(lambda: count("SELECT count(seconds) FROM gloo_phase"), quiet_s=3.0,
                 timeout_s=60, what="phases in InfluxDB")
    summary = {}
    for node, name in zip(lab.nodes, names):
        step_rows = influx.query(f"SELECT step, seconds FROM train_step WHERE node='{name}'",
                                 db="fabricscope")
        missed = stack.agent_metric(node.index, "fabricscope_agent_events_lost_total",
                                    {"probe": "tcp_flows"})
        summary[name] = {"retransmits_influx": stored[name],
                         "retransmits_kernel": after[node.index] - before[node.index],
                         "missed": int(missed),
                         "steps": {int(r["step"]): float(r["seconds"]) for r in step_rows},
                         **phases(influx, name)}
    return summary


def phases(influx, node: str) -> dict:
    """Where one node's step time went, from the agent's inferred phases."""
    def rows(query: str) -> list[dict]:
        return influx.query(query, db="fabricscope")

    sync = rows(f"SELECT step, seconds FROM gloo_phase WHERE node='{node}' "
                "AND phase='grad_sync'")
    data = rows(f"SELECT step, seconds FROM gloo_phase WHERE node='{node}' "
                "AND phase='data_load'")
    data_per_step: dict[int, float] = {}
    for r in data:
        data_per_step[int(r["step"])] = data_per_step.get(int(r["step"]), 0.0) + r["seconds"]
    retrans = rows(f"SELECT sum(sync_retrans_segs) FROM gloo_step WHERE node='{node}'")
    ckpt = rows(f"SELECT sum(bytes_out) FROM gloo_phase WHERE node='{node}' "
                "AND phase='checkpoint'")
    return {"sync": {int(r["step"]): float(r["seconds"]) for r in sync},
            "data": data_per_step,
            "retrans_in_sync": int(retrans[0]["sum"]) if retrans else 0,
            "checkpoint_bytes": int(ckpt[0]["sum"]) if ckpt else 0}


def print_summary(summary: dict, steps: list[dict], half: int, args) -> None:
    def median(values):
        return statistics.median(values) if values else float("nan")

    print()
    print("What reached InfluxDB, per node")
    print(f"{'node':<8}{'retransmits':>13}{'kernel says':>13}{'lost*':>7}{'steps':>7}"
          f"{'median s/step before':>22}{'after fault':>13}")
    for name, s in summary.items():
        pre = [v for k, v in s["steps"].items() if k < half - 1]
        post = [v for k, v in s["steps"].items() if k >= half]
        print(f"{name:<8}{s['retransmits_influx']:>13}{s['retransmits_kernel']:>13}"
              f"{s['missed']:>7}{len(s['steps']):>7}{median(pre):>22.3f}{median(post):>13.3f}")
    print("* TCP events the kernel skipped or the agent lost, counted by the agent "
          "(fabricscope_agent_events_lost_total{probe=\"tcp_flows\"})")
    print()
    print("Where the step time went, per node (inferred by the agents, no markers)")
    print(f"{'node':<8}{'grad sync s/step':>18}{'after fault':>13}{'data load s/step':>18}"
          f"{'after fault':>13}{'retrans in grad sync':>22}{'checkpoint MiB':>16}")
    for name, s in summary.items():
        def split(per_step):
            return (median([v for k, v in per_step.items() if k < half - 1]),
                    median([v for k, v in per_step.items() if k >= half]))
        sync, data = split(s["sync"]), split(s["data"])
        print(f"{name:<8}{sync[0]:>18.4f}{sync[1]:>13.4f}{data[0]:>18.4f}{data[1]:>13.4f}"
              f"{s['retrans_in_sync']:>22}{s['checkpoint_bytes'] / 2**20:>16.1f}")
    pre = median([r["seconds"] for r in steps if r["step"] < half - 1])
    post = median([r["seconds"] for r in steps if r["step"] >= half])
    print()
    print(f"Step time went from {pre:.3f} s to {post:.3f} s (x{post / pre:.2f}) after "
          f"{args.loss:g}% loss on node{args.fault_node}'s port; node{args.fault_node} "
          f"retransmitted {summary[f'node{args.fault_node}']['retransmits_influx']} segments.")
    sys.stdout.flush()
