"""Adversarial probes of scripts/serve.py (issue 57): what one request can cost the server.

    python scripts/probe_serve.py GRU_CKPT --transformer TRANSFORMER_CKPT [--json FILE]

Text that tokenizes to about one subword per character (`"aA" * 500`: 1,000 subwords and EOS on
the shared checkpoint) is sent to a server started with its default limits, each probe on its own:
one and six greedy sentences, one at beam 11 / n-best 11, nine /api/align pairs of it, and two
greedy sentences (what the limits take: the memory a large answer leaves behind); then 32 clients
sending the first case at once, and two clients sending it with SIGTERM sent 1 s in; then, to a
second server, one Transformer sentence of 1,000 characters at beam 16 / n-best 16. While each of
the first five and the last runs, a one-word request is sent 0.5 s in (`one word s`: its wait).

Per probe: wall time, the server's CPU seconds (user + system, every thread) and peak resident
memory (VmRSS sampled every 20 ms), the statuses, the answer's size, and the machine's 1-minute
load average as it ended (on a shared machine the wall times follow the load; the CPU seconds
do not); the server's resident memory before the first five probes and after them. Every request
has a deadline (`--timeout`), and a server past `--rss-cap` MB is killed: a probe of a server
without limits ends either way, and a killed or stuck server is started afresh for the next probe
(its "before" memory then lost). Clients talk to 127.0.0.1 only. Standard library only: the same
script probes any version of the server (`--serve` names its serve.py).
"""

import argparse
import http.client
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from seq2seq.atomic import atomic_write_text, check_writable_file
from seq2seq.cli import Parser
from seq2seq.errors import UserError

ATTACK = "aA" * 500  # 1,000 characters, about one subword each
WORD = "Hund"
TICK = os.sysconf("SC_CLK_TCK")


class Server:
    """serve.py CKPT in a child on 127.0.0.1 and a free port, with its CPU time and memory."""

    def __init__(self, serve: Path, checkpoint: str, extra: list[str]) -> None:
        command = [sys.executable, str(serve), checkpoint, "--port", "0", "--device", "cpu",
                   "--log-level", "error", *extra]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(serve.resolve().parent.parent)}
        self.child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        ready = select.select([self.child.stdout], [], [], 300)[0]
        line = self.child.stdout.readline() if ready else ""
        if " at http://" not in line:
            self.kill()
            raise SystemExit(f"error: {serve} did not start ({line.strip() or 'no answer'})")
        self.port = int(line.rsplit(":", 1)[1].strip(" /\n"))

    def rss_mb(self) -> float:
        try:
            with open(f"/proc/{self.child.pid}/status") as status:
                return next(int(ln.split()[1]) / 1024 for ln in status if ln.startswith("VmRSS"))
        except (OSError, StopIteration):
            return 0.0

    def cpu_s(self) -> float:
        try:
            with open(f"/proc/{self.child.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime

    def alive(self) -> bool:
        return self.child.poll() is None

    def kill(self) -> None:
        if self.child.poll() is None:
            self.child.kill()
        self.child.wait(30)


def post(port: int, path: str, body: dict[str, Any], timeout: float) -> tuple[int, int, str]:
    """Status, body bytes and the error message (if any) of one POST; status 0 for no answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        answer = conn.getresponse()
        raw = answer.read()
    except (OSError, http.client.HTTPException) as err:
        return 0, 0, type(err).__name__
    finally:
        conn.close()
    try:
        message = json.loads(raw).get("error", "") if answer.status != 200 else ""
    except ValueError:
        message = "not JSON: " + raw[:60].decode("utf-8", "replace")
    return answer.status, len(raw), message


class Watch:
    """Samples the server's VmRSS every 20 ms; kills it past `cap` MB."""

    def __init__(self, server: Server, cap: float) -> None:
        self.server, self.cap, self.peak, self.killed = server, cap, server.rss_mb(), False
        self.cpu_s = server.cpu_s()  # the last reading: a server that exits keeps it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02) and self.server.alive():
            self.peak = max(self.peak, self.server.rss_mb())
            self.cpu_s = self.server.cpu_s() or self.cpu_s
            if self.peak > self.cap:
                self.killed = True
                self.server.kill()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def probe(
    server: Server, name: str, requests: list[tuple[str, dict]], args: argparse.Namespace,
    side: bool = False, term_at: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Send `requests` at once (a thread each) and measure the server while they run."""
    results: list[tuple[int, int, str, float]] = [(0, 0, "not sent", 0.0)] * len(requests)
    side_s: list[float] = []

    def send(i: int, path: str, body: dict[str, Any]) -> None:
        start = time.monotonic()
        status, size, message = post(server.port, path, body, args.timeout)
        results[i] = (status, size, message, time.monotonic() - start)

    def side_request() -> None:
        time.sleep(0.5)
        start = time.monotonic()
        status, _, _ = post(server.port, "/api/translate", {"sentences": [WORD], "beam": 1}, 30)
        side_s.append(time.monotonic() - start if status == 200 else float("inf"))

    rss0 = server.rss_mb()
    watch, cpu0, start = Watch(server, args.rss_cap), server.cpu_s(), time.monotonic()
    threads = [threading.Thread(target=send, args=(i, *r)) for i, r in enumerate(requests)]
    threads += [threading.Thread(target=side_request)] if side else []
    for thread in threads:
        thread.start()
    exited = None
    if term_at is not None:
        time.sleep(term_at)
        server.child.send_signal(signal.SIGTERM)
        try:
            server.child.wait(args.timeout)
            exited = time.monotonic() - start - term_at
        except subprocess.TimeoutExpired:
            exited = float("inf")
    for thread in threads:
        thread.join()
    took = time.monotonic() - start
    watch.stop()
    cpu = (server.cpu_s() or watch.cpu_s) - cpu0
    time.sleep(1)  # what the server keeps once the answer is out
    rss1 = server.rss_mb() if server.alive() and "0" not in [str(r[0]) for r in results] else 0
    statuses: dict[str, int] = {}
    for status, *_ in results:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    row = {"probe": name, "load": round(os.getloadavg()[0], 1), "seconds": round(took, 2), "cpu_s": round(cpu, 2),
           "peak_rss_mb": round(watch.peak), "rss_mb": f"{rss0:.0f} -> {rss1:.0f}" if rss1 else "",
           "statuses": statuses,
           "slowest_s": round(max(r[3] for r in results), 2),
           "body_mb": round(max(r[1] for r in results) / 2**20, 2),
           "message": next((r[2] for r in results if r[2]), "")[:160]}  # fmt: skip
    if side:
        row["side_s"] = round(side_s[0], 2) if side_s else None
    if exited is not None:
        row["exit_after_term_s"] = round(exited, 2)
    if watch.killed:
        row["message"] = f"killed: resident memory past {args.rss_cap:.0f} MB"
    return row


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="the GRU checkpoint (the shared one)")
    parser.add_argument("--transformer", required=True, help="a Transformer checkpoint")
    parser.add_argument(
        "--serve",
        type=Path,
        default=Path(__file__).with_name("serve.py"),
        help="the serve.py to probe (its folder's parent goes on PYTHONPATH)",
    )
    parser.add_argument("--timeout", type=float, default=60, help="seconds a request may take")
    parser.add_argument(
        "--rss-cap", type=float, default=4000, help="MB before the server is killed"
    )
    parser.add_argument("--json", help="write the rows here too")
    parser.add_argument("--transformer-only", action="store_true", help="the last probe alone")
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an argument for serve.py, as --serve-arg=--max-seconds=60 (repeat)",
    )
    args = parser.parse_args(argv)
    if args.json:  # refused now, not after the minutes of the probes
        try:
            check_writable_file(args.json, f"--json {args.json}")
        except UserError as err:
            parser.error(str(err))
    greedy = {"sentences": [ATTACK], "beam": 1}
    cases = [
        ("greedy x1", [("/api/translate", greedy)]),
        ("greedy x6", [("/api/translate", {"sentences": [ATTACK] * 6, "beam": 1})]),
        ("beam 11 / n-best 11", [("/api/translate",
                                  {"sentences": [ATTACK], "beam": 11, "nbest": 11})]),
        ("align x9", [("/api/align", {"sentences": [ATTACK] * 9, "references": [ATTACK] * 9})]),
        ("greedy x2", [("/api/translate", {"sentences": [ATTACK] * 2, "beam": 1})]),
    ]  # fmt: skip
    rows: list[dict[str, Any]] = []
    rss: dict[str, Any] = {"rss_before_mb": None, "rss_after_mb": None}
    if not args.transformer_only:
        rss = gru_probes(args, cases, greedy, rows)
    transformer_probe(args, rows)
    print(table(rows, rss))
    if args.json:
        atomic_write_text(args.json, json.dumps({"rows": rows, **rss}, indent=1) + "\n")  # whole
    return 0


def gru_probes(
    args: argparse.Namespace, cases: list, greedy: dict[str, Any], rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """The probes of the GRU server; its resident memory before and after the first five."""
    server = Server(args.serve, args.checkpoint, args.serve_arg)
    try:
        post(server.port, "/api/translate", {"sentences": [WORD], "beam": 1}, 60)  # warm
        before = server.rss_mb()
        for name, requests in cases:
            rows.append(probe(server, name, requests, args, side=True))
            print(json.dumps(rows[-1]), flush=True)
            if "0" in rows[-1]["statuses"] or not server.alive():  # still busy, or killed
                server.kill()
                server, before = Server(args.serve, args.checkpoint, args.serve_arg), None
        time.sleep(1)
        after = server.rss_mb() if before is not None else None  # a restart loses the "before"
        rss = {"rss_before_mb": before and round(before), "rss_after_mb": after and round(after)}
        print(json.dumps(rss), flush=True)
        for name, requests, term in [
            ("32 clients, greedy x1", [("/api/translate", greedy)] * 32, None),
            ("2 x greedy x1, SIGTERM at 1 s", [("/api/translate", greedy)] * 2, 1.0),
        ]:
            if not server.alive() or term is None and rows[-1]["statuses"].get("0"):
                server.kill()
                server = Server(args.serve, args.checkpoint, args.serve_arg)
            rows.append(probe(server, name, requests, args, term_at=term))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        server.kill()
    return rss


def transformer_probe(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    server = Server(args.serve, args.transformer, args.serve_arg)
    try:
        body = {"sentences": [ATTACK], "beam": 16, "nbest": 16}
        rows.append(probe(server, "Transformer beam 16 / n-best 16", [("/api/translate", body)],
                          args, side=True))  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    finally:
        server.kill()


def table(rows: list[dict[str, Any]], rss: dict[str, Any]) -> str:
    """The rows as a Markdown table, and the resident memory before and after."""
    lines = ["| probe | load | status | s | CPU s | peak MB | MB before -> after | answer MB | "
             "one word s | message |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        status = ", ".join(f"{n} x {s}" if n > 1 else s for s, n in r["statuses"].items())
        side = r.get("side_s", "")
        if "exit_after_term_s" in r:
            side = f"exit {r['exit_after_term_s']} s after SIGTERM"
        lines.append(f"| {r['probe']} | {r['load']} | {status} | {r['seconds']} | {r['cpu_s']} | "
                     f"{r['peak_rss_mb']} | {r['rss_mb']} | {r['body_mb']} | {side} | {r['message']} |")  # fmt: skip
    lines.append(f"\nresident MB before the first five probes: {rss['rss_before_mb']}, "
                 f"after them: {rss['rss_after_mb']}")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
