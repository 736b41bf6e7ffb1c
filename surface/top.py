"""`fabricscope top`: what the fabric and the jobs do now, in a terminal.

Every second (--interval) it reads the last seconds from the store with the
boards' query builders (surface/grafana_queries.select) and draws four tables:
the links (per node and interface: tx/rx rate, the busiest 100 us bin as a rate
and as a share of the line rate where the link has one, the node's resent share
of its segments, its flows' RTT p90), the latest step of
every rank (step time, gradient sync share, segments resent), the collectives
(count, p50 and max duration, bus bandwidth) and the open findings (severity,
cause, place, impact, the summary cut to the width). `q` quits; a resize redraws
at the new size; a terminal too small for the tables says so until it grows.
`--once` prints one frame as plain text. A store that stops answering shows as
a line at the top while the last frame stays. The store is read on a thread of
its own, so a key is answered within 0.1 s however long a query takes.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass, field

from fabricscope.diagnosis.finding import Finding, severity_rank
from fabricscope.diagnosis.jobclass import stored_classes
from fabricscope.diagnosis.timespan import SECOND, Span
from fabricscope.errors import UserError
from fabricscope.surface import jobclass
from fabricscope.surface.grafana.queries import agg, raw, select
from fabricscope.surface.report.data import Scope
from fabricscope.jobs import job_label

LINK_S = 5                  # links and findings: the last seconds
COLLECTIVE_S = 10
STEP_S = 60                 # a rank's latest step, however slow
MIN_WIDTH, MIN_HEIGHT = 60, 16        # four tables' titles, heads and first rows
FIRST_LINES = 3             # a table's title, head and first row: each gets these first
#: who gets the rows left once every table has its first: the open findings, then links
PRIORITY = (3, 0, 1, 2)
FINDING_COLUMNS = ("id", "job", "cause", "severity", "open", "summary", "node", "interface",
                   "peer", "tor", "rank", "step_seconds_added", "share_of_step")

NIC = select("nic_window", [agg("mean", "rate_bps"), agg("max", "peak_bps"),
                           agg("max", "peak_util")], by_time=False,
             by_tags=("node", "interface", "direction"))
TCP = select("tcp_node", [agg("sum", "retrans_segs"), agg("sum", "segs_out")], by_time=False,
             by_tags=("node",))
RTT = select("tcp_flow", [agg("mean", "rtt_p90_us", "p90")], by_time=False, by_tags=("node",))
STEPS = select("gloo_step", [raw("step"), raw("seconds"), raw("comm_fraction"),
                             raw("retrans_segs")], by_time=False,
               by_tags=("job", "rank", "node"), tail="ORDER BY time DESC LIMIT 3")
COLLECTIVES = select("gloo_collective", [agg("count", "seconds", "n"),
                                         agg("percentile", "seconds", "p50", "50"),
                                         agg("max", "seconds", "max"),
                                         agg("mean", "busbw_gbs", "busbw")],
                     by_time=False, by_tags=("job", "op"))
FINDINGS = select("finding", [raw(c) for c in FINDING_COLUMNS], by_time=False,
                  time_filter=False, where=('"open" = true',))


@dataclass
class Link:
    node: str
    interface: str
    tx_bps: float = 0.0
    rx_bps: float = 0.0
    peak_bps: float = 0.0                 # the busiest 100 us bin of either direction
    peak_util: float | None = None        # its share of the line rate; None: unknown
    retrans_ratio: float | None = None
    rtt_p90_us: float | None = None


@dataclass
class RankStep:
    job: str
    rank: str
    node: str
    step: int
    seconds: float | None
    comm_fraction: float | None
    retrans_segs: int
    age_s: float


@dataclass
class Collective:
    job: str
    op: str
    count: int
    p50_s: float | None
    max_s: float | None
    busbw_gbs: float | None


@dataclass
class TopData:
    at_ns: int
    job: str | None
    links: list[Link] = field(default_factory=list)
    steps: list[RankStep] = field(default_factory=list)
    collectives: list[Collective] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    #: job -> its classification (surface/jobclass.py): read() takes each job's latest
    #: stored job_class point of the last STEP_S
    classes: dict[str, object] = field(default_factory=dict)
    error: str = ""          # the store's last failure, while the frame shows older data


def _last(seconds: int, now_ns: int) -> Span:
    return Span(now_ns - seconds * SECOND, now_ns)


def read(store, job: str | None, now_ns: int | None = None) -> TopData:
    now = time.time_ns() if now_ns is None else now_ns
    data = TopData(now, job)
    rows = Scope(_last(STEP_S, now), job).rows(store, STEPS)
    seen = set()
    for r in rows:              # newest first per rank: the first with a length
        t = r["_tags"]
        key = (t.get("job"), t.get("rank"))
        if key in seen or r.get("seconds") is None:
            continue
        seen.add(key)
        data.steps.append(RankStep(t.get("job", ""), t.get("rank", "-"), t.get("node", ""),
                                   int(r.get("step") or 0), r.get("seconds"),
                                   r.get("comm_fraction"), int(r.get("retrans_segs") or 0),
                                   (now - int(r["time"])) / SECOND))
    data.steps.sort(key=lambda s: (s.job, _rank_key(s.rank)))
    nodes = tuple(sorted({s.node for s in data.steps})) if job else ()
    if not job or nodes:            # a job's links are its nodes'; a job without steps has none
        data.links = _links(store, Scope(_last(LINK_S, now), job, nodes))
    data.collectives = sorted(
        (Collective(r["_tags"].get("job", ""), r["_tags"].get("op", ""), int(r.get("n") or 0),
                    r.get("p50"), r.get("max"), r.get("busbw"))
         for r in Scope(_last(COLLECTIVE_S, now), job).rows(store, COLLECTIVES)),
        key=lambda c: (c.job, -c.count))
    data.classes = stored_classes(store, now - STEP_S * SECOND, now, job)
    data.findings = sorted((Finding.from_row({**r, **r["_tags"]})
                            for r in Scope(_last(LINK_S, now), job).rows(store, FINDINGS)),
                           key=lambda f: (-severity_rank(f.severity), -f.step_seconds_added))
    return data


def _links(store, scope: Scope) -> list[Link]:
    """Per node and interface: both directions' rates and the busiest bin, with the
    node's resent share and RTT."""
    by_link: dict[tuple, Link] = {}
    for r in scope.rows(store, NIC):
        t = r["_tags"]
        link = by_link.setdefault((t["node"], t["interface"]), Link(t["node"], t["interface"]))
        setattr(link, "tx_bps" if t.get("direction") == "tx" else "rx_bps",
                float(r.get("rate_bps") or 0.0))
        link.peak_bps = max(link.peak_bps, float(r.get("peak_bps") or 0.0))
        if r.get("peak_util") is not None:         # absent: the link has no line rate
            link.peak_util = max(link.peak_util or 0.0, float(r["peak_util"]))
    resent = {r["_tags"]["node"]: r["retrans_segs"] / r["segs_out"]
              for r in scope.rows(store, TCP) if r.get("segs_out")}
    rtt = {r["_tags"]["node"]: r.get("p90") for r in scope.rows(store, RTT)}
    for link in by_link.values():
        link.retrans_ratio, link.rtt_p90_us = resent.get(link.node), rtt.get(link.node)
    return [by_link[k] for k in sorted(by_link) if _busy(by_link[k])]


def _busy(link: Link) -> bool:
    """Loopback and idle interfaces would crowd out the ones that carry the job."""
    return link.interface != "lo" and (link.tx_bps > 0 or link.rx_bps > 0)


def _rank_key(rank: str):
    return (0, int(rank)) if rank.isdigit() else (1, rank)


# -- the frame ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Line:
    text: str
    style: str = ""          # title, head, critical, warning, note or ""


def _fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def _table(title: str, head: str, rows: list[Line]) -> list[Line]:
    return [Line(title, "title"), Line(head, "head"), *(rows or [Line("  (none)", "note")])]


def class_lines(data: TopData) -> list[Line]:
    """One line per job whose classification the frame was handed: its class and the
    rule that decided it."""
    return [Line(f"job {job_label(job)}: {jobclass.read(c).headline}", "note")
            for job, c in sorted(data.classes.items())]


def _link_lines(links: list[Link]) -> list[Line]:
    rows = [Line(f"{k.node:<10}{k.interface:<16}{k.tx_bps / 1e6:>10.1f}{k.rx_bps / 1e6:>10.1f}"
                 f"{k.peak_bps / 1e6:>10.1f}{_fmt(k.peak_util, '.0%', 'unknown'):>10}"
                 f"{_fmt(k.retrans_ratio, '.2%'):>9}{_fmt(k.rtt_p90_us, '.0f'):>11}")
            for k in links]
    if any(k.peak_util is None for k in links):
        rows.append(Line("  peak util unknown: line rate unknown (a virtual link), the peak "
                         "rate is all there is", "note"))
    return rows


def sections(data: TopData, width: int) -> list[list[Line]]:
    links = _link_lines(data.links)
    jw = max([len(s.job) for s in data.steps] + [len(c.job) for c in data.collectives] + [4]) + 2
    steps = [Line(f"{s.job:<{jw}}{s.rank:<6}{s.node:<10}{s.step:>6}{_fmt(s.seconds, '.3f'):>9}"
                  f"{_fmt(s.comm_fraction, '.0%'):>11}{s.retrans_segs:>8}{s.age_s:>7.0f}s")
             for s in data.steps]
    colls = [Line(f"{c.job:<{jw}}{c.op:<16}{c.count:>7}{_fmt(c.p50_s, '.3f'):>9}"
                  f"{_fmt(c.max_s, '.3f'):>9}{_fmt(c.busbw_gbs, '.4f'):>12}")
             for c in data.collectives]
    found = []
    for f in data.findings:
        impact = f"+{f.step_seconds_added:.2f}s" if f.step_seconds_added else "-"
        text = f"{f.severity.upper():<10}{f.cause:<22}{f.where[:24]:<26}{impact:>8}  "
        found.append(Line(text + f.summary[:max(0, width - len(text) - 1)],
                          f.severity if f.severity != "info" else ""))
    return [
        _table(f"LINKS (last {LINK_S} s)", f"{'node':<10}{'interface':<16}{'tx Mb/s':>10}"
               f"{'rx Mb/s':>10}{'peak Mb/s':>10}{'peak util':>10}{'resent':>9}{'RTT p90 us':>11}",
               links),
        _table("STEPS (latest per rank)", f"{'job':<{jw}}{'rank':<6}{'node':<10}{'step':>6}"
               f"{'step s':>9}{'grad sync':>11}{'resent':>8}{'age':>8}", steps),
        _table(f"COLLECTIVES (last {COLLECTIVE_S} s)", f"{'job':<{jw}}{'op':<16}{'count':>7}"
               f"{'p50 s':>9}{'max s':>9}{'busbw GB/s':>12}", colls),
        _table("OPEN FINDINGS", f"{'severity':<10}{'cause':<22}{'place':<26}{'s/step':>8}  "
               "summary", found)]


def frame(data: TopData | None, width: int, height: int) -> list[Line]:
    """The screen: a header, then the four tables, each cut to its share of the height
    (a table that does not fit says in its title how many rows it leaves out); every
    line cut to the width."""
    if width < MIN_WIDTH or height < MIN_HEIGHT:
        text = f"terminal too small ({width}x{height}): needs {MIN_WIDTH}x{MIN_HEIGHT}"
        return [Line(text[:max(1, width - 1)], "critical"), Line("q quits"[:max(1, width - 1)])]
    when = time.strftime("%H:%M:%S", time.localtime(data.at_ns / SECOND)) if data else "-"
    head = [Line(f"fabricscope top  job {job_label(data.job) if data and data.job else 'all'}  {when}  "
                 "q quits", "title")]
    if data is None:
        return head + [Line("reading the store...", "note")]
    if data.error:
        head.append(Line(f"store: {data.error} (showing {when})", "critical"))
    tables = sections(data, width)
    # the classes take what the tables' titles, heads and first rows leave
    spare = height - len(head) - (len(tables) - 1) - sum(min(len(t), FIRST_LINES) for t in tables)
    head += class_lines(data)[:max(0, spare)]
    room = height - len(head) - (len(tables) - 1)       # a blank line between tables
    budget = _share(room, [len(t) for t in tables])
    out = list(head)
    for i, (table, n) in enumerate(zip(tables, budget)):
        if i:
            out.append(Line(""))
        if n < len(table):          # the title says what is left out: no row spent on it
            title = Line(f"{table[0].text}  (+{len(table) - n} not shown)", "title")
            table = [title] + table[1:n]
        out += table
    return [Line(x.text[:width - 1], x.style) for x in out[:height]]


def _share(room: int, sizes: list[int]) -> list[int]:
    """Lines per table: each gets its title, head and a first row (or its note) before
    any gets more; then the rest go to the tables in PRIORITY order."""
    give = [min(s, FIRST_LINES) for s in sizes]
    room -= sum(give)
    for i in PRIORITY:
        extra = max(0, min(sizes[i] - give[i], room))
        give[i] += extra
        room -= extra
    return give


# -- running --------------------------------------------------------------------------------

def check(args) -> None:
    """What needs no store: checked before the store is asked."""
    if not args.interval > 0:
        raise UserError(f"--interval {args.interval} is not positive", "give e.g. --interval 1")
    if args.width < 0:
        raise UserError(f"--width {args.width} is negative", "give e.g. --width 120")


def run_top(store, args) -> int:
    check(args)
    if args.once:
        width = args.width or shutil.get_terminal_size((120, 40)).columns
        for line in frame(read(store, args.job), width, 10**6):
            print(line.text)
        return 0
    import curses
    # the size from the terminal itself: ncurses prefers LINES and COLUMNS from the
    # environment, and inherited ones would pin every frame to a size the terminal
    # does not have (and hide resizes)
    for name in ("LINES", "COLUMNS"):
        os.environ.pop(name, None)
    return curses.wrapper(_loop, store, args)


def _loop(screen, store, args) -> int:
    import curses
    styles = _styles(curses)
    try:
        curses.curs_set(0)
    except curses.error:
        pass
    screen.timeout(100)                 # a key is read within 0.1 s
    reader = Reader(store, args.job, args.interval)
    reader.start()
    try:
        while True:
            if reader.failure is not None:
                raise reader.failure
            _draw(screen, reader.data, styles, curses)
            key = screen.getch()
            if key in (ord("q"), ord("Q")):
                return 0
            if key == curses.KEY_RESIZE:
                # a frame drawn at the old size may have scrolled the terminal: repaint it all
                curses.update_lines_cols()
                screen.clear()
    finally:
        reader.stop()


def _draw(screen, data: TopData | None, styles: dict[str, int], curses) -> None:
    height, width = screen.getmaxyx()
    screen.erase()
    for y, line in enumerate(frame(data, width, height)):
        try:
            screen.addnstr(y, 0, line.text, width - 1, styles.get(line.style, 0))
        except curses.error:            # the terminal shrank under us: the next frame fits
            break
    screen.refresh()


class Reader:
    """Reads the store every `interval` seconds on a daemon thread; `data` is the
    latest frame's data (None before the first read). A store error is shown on the
    frame (_refresh); anything else ends the thread as `failure`, which the screen's
    loop raises. Quitting never waits for a query in flight: the thread is a daemon
    and `stop` only asks it to end."""

    def __init__(self, store, job: str | None, interval: float):
        self.store, self.job, self.interval = store, job, interval
        self.data: TopData | None = None
        self.failure: BaseException | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="top-reader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self.data = _refresh(self.store, self.job, self.data)
                self._stopping.wait(self.interval)
        except Exception as exc:        # noqa: BLE001 - handed to the screen's thread
            self.failure = exc


def _refresh(store, job: str | None, last: TopData | None) -> TopData:
    try:
        return read(store, job)
    except UserError as exc:            # the store blinked: keep the last frame, say why
        if last is None:
            return TopData(time.time_ns(), job, error=exc.cause)
        last.error = exc.cause
        return last


def _styles(curses) -> dict[str, int]:
    styles = {"title": curses.A_BOLD, "head": curses.A_UNDERLINE, "note": curses.A_DIM,
              "critical": curses.A_BOLD, "warning": curses.A_BOLD}
    if curses.has_colors():
        curses.start_color()
        curses.use_default_colors()
        curses.init_pair(1, curses.COLOR_RED, -1)
        curses.init_pair(2, curses.COLOR_YELLOW, -1)
        styles["critical"] |= curses.color_pair(1)
        styles["warning"] |= curses.color_pair(2)
    return styles
