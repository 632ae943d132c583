"""Load test of scripts/serve.py: throughput and latency under concurrent clients, and memory.

    python scripts/benchmark_serve.py CKPT --src-file test.de.gz [--quick] [--json FILE]

ceilings: `Translator.translate` called directly in this process on the sentences a level sends (no
HTTP; the median of three passes): all of them in one call (the model's own batching), and in
calls of 1, 4 and 16 sentences, the most that 1, 4 and 16 clients sending one sentence at a time
can have in flight, each measured right before its level: sentences/s. server: scripts/serve.py CKPT
in a child process on 127.0.0.1, and 1, 4 and 16 client threads here, each with its own connection
sending one-sentence requests one after another (POST /api/translate, alignments off, as the
ceiling), greedy and beam 5: sentences/s, p50 and p99 latency, and the ratio to each ceiling.
ceiling_with_second_thread: greedy batches of 1 and 16 again, while another thread that has called
`translate` once is alive (what a server pays that loads on one thread and translates on another).
memory: a fresh server's resident memory (VmRSS) after 100 and after 10,000 requests from 16
clients (beam 5, alignments on: what the page asks for). Both processes use torch's default
thread count; the clients only wait on sockets. Every client talks to 127.0.0.1 only; every wait
has a deadline. `--quick`: 16 requests a level, memory after 20 and 200 requests.
"""

import http.client
import importlib.util
import json
import os
import select
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from seq2seq.atomic import atomic_write_text, check_writable_file
from seq2seq.cli import Parser, cli_message, count
from seq2seq.errors import UserError

SERVE = Path(__file__).with_name("serve.py")
CLIENTS = (1, 4, 16)
BEAMS = (1, 5)
TIMEOUT = 120  # seconds one request may take before the run is called broken
JSON = {"Content-Type": "application/json"}  # the server refuses a POST of any other type (415)


def read_sentences(path: str, count: int) -> list[str]:
    """The first `count` non-blank lines of `path` (plain or .gz), its lines over again if fewer."""
    from seq2seq.data.corpus import read_lines

    found = [line.strip() for line in read_lines(path) if line.strip()]
    if not found:
        raise UserError(f"--src-file {path}: no sentences")
    return [found[i % len(found)] for i in range(count)]


def machine() -> dict[str, Any]:
    """What the figures were measured on, and at which commit."""
    from seq2seq.machine import cpu_model, git_commit

    model, commit = cpu_model(), git_commit(short=True)
    # what uvicorn's "auto" picks for the server: the C event loop and HTTP parser when installed
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return {"cpu": model, "cores": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "loop": loop, "http": http,
            "commit": commit or None}  # fmt: skip


def ceiling(translator: Any, sentences: list[str], beam: int, size: int | None) -> float:
    """Sentences/s of direct `Translator.translate` calls over `sentences`, `size` at a time (None:
    all in one call, the model's own batching): the median of three passes after a warm-up, as the
    server's figure comes after its own."""
    translator.translate(sentences[:8], beam=beam)
    step = size or len(sentences)
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        for first in range(0, len(sentences), step):
            translator.translate(sentences[first : first + step], beam=beam)
        seconds.append(time.perf_counter() - start)
    return len(sentences) / statistics.median(seconds)


class Server:
    """scripts/serve.py CKPT in a child on 127.0.0.1 and a free port; stopped on exit."""

    def __init__(self, checkpoint: str, device: str) -> None:
        command = [sys.executable, str(SERVE), checkpoint, "--port", "0", "--device", device,
                   "--log-level", "warning", "--max-queue", "1024"]  # fmt: skip
        self.child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        ready = select.select([self.child.stdout], [], [], 300)[0]
        line = self.child.stdout.readline() if ready else ""
        if " at http://127.0.0.1:" not in line:
            self.close()
            raise SystemExit(f"error: serve.py did not start ({line.strip() or 'no answer'})")
        self.port = int(line.rsplit(":", 1)[1].strip(" /\n"))

    def rss_mb(self) -> float:
        with open(f"/proc/{self.child.pid}/status") as status:
            return next(int(ln.split()[1]) / 1024 for ln in status if ln.startswith("VmRSS"))

    def close(self) -> None:
        self.child.terminate()
        try:
            self.child.wait(30)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait(30)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(port: int, clients: int, jobs: list[str], beam: int, alignments: bool) -> dict[str, Any]:
    """`clients` threads share `jobs` (one sentence a request, in turn); their latencies and the
    sentences/s of the whole level. A request that fails stops the run: the figures would lie."""
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def client(mine: list[str]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        try:
            for sentence in mine:
                body = {"sentences": [sentence], "beam": beam, "alignments": alignments}
                start = time.perf_counter()
                conn.request("POST", "/api/translate", json.dumps(body), JSON)
                answer = conn.getresponse()
                text = answer.read()
                took = time.perf_counter() - start
                with lock:
                    latencies.append(took)
                    if answer.status != 200:
                        failures.append(f"{answer.status} {text[:200]!r}")
        except OSError as err:
            with lock:
                failures.append(repr(err))
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(jobs[k::clients],)) for k in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT * len(jobs))
    wall = time.perf_counter() - start
    if failures or any(thread.is_alive() for thread in threads):
        raise SystemExit(f"error: {len(failures)} requests failed, e.g. {failures[:1]}")
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")  # 99 cut points
    return {"clients": clients, "beam": beam, "requests": len(jobs),
            "sentences_per_sec": len(jobs) / wall, "p50_ms": 1000 * cuts[49],
            "p99_ms": 1000 * cuts[98]}  # fmt: skip


def memory(checkpoint: str, device: str, sentences: list[str], marks: tuple[int, int]) -> dict:
    """A fresh server's VmRSS after marks[0] and after marks[1] requests from 16 clients."""
    with Server(checkpoint, device) as server:
        done, rss = 0, {}
        for mark in marks:
            jobs = [sentences[i % len(sentences)] for i in range(done, mark)]
            load(server.port, 16, jobs, beam=5, alignments=True)
            done, rss[f"rss_mb_after_{mark}"] = mark, server.rss_mb()
    first, last = (rss[f"rss_mb_after_{mark}"] for mark in marks)
    return {**rss, "growth": last / first - 1}


def main(argv: list[str] | None = None) -> int:
    quick = "--quick" in (sys.argv[1:] if argv is None else argv)  # it sets the defaults below
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", metavar="CKPT")
    parser.add_argument("--src-file", required=True, help="source sentences (plain or .gz)")
    parser.add_argument("--quick", action="store_true", help="a short, noisy run of every figure")
    parser.add_argument(
        "--requests", type=count, default=16 if quick else 400, help="requests a level sends"
    )
    parser.add_argument(
        "--memory-marks", type=count, nargs=2, default=(20, 200) if quick else (100, 10_000),
        metavar=("EARLY", "LATE"), help="read the server's RSS after this many requests",
    )  # fmt: skip
    parser.add_argument("--device", default="cpu", help="cpu, cuda, ... for both processes")
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args(argv)
    if args.memory_marks[0] >= args.memory_marks[1]:
        parser.error(f"--memory-marks {' '.join(map(str, args.memory_marks))}: EARLY before LATE")
    from seq2seq.decoding.translator import Translator

    try:  # refused now, not after the minutes of the run
        if args.json:
            check_writable_file(args.json, f"--json {args.json}")
        sentences = read_sentences(args.src_file, max(args.requests, 1000))
        translator = Translator.load(args.checkpoint, args.device)
    except UserError as err:
        print(f"error: {cli_message(err)}", file=sys.stderr)
        return 2
    jobs = sentences[: args.requests]
    result: dict[str, Any] = {"machine": machine(), "checkpoint": args.checkpoint,
                              "src_file": args.src_file, "ceiling": {}, "server": []}  # fmt: skip
    with Server(args.checkpoint, args.device) as server:
        load(server.port, 4, jobs[:8], beam=1, alignments=False)  # warm-up
        for beam in BEAMS:
            print(f"beam {beam}: one call ...", file=sys.stderr, flush=True)
            one_call = ceiling(translator, jobs, beam, None)  # the model's own batching
            result["ceiling"][f"beam{beam}_one_call"] = one_call
            for clients in CLIENTS:
                # Right before the level, so that the ratio is of two figures measured at the same
                # moment (this shared machine's speed drifts by a tenth and more over minutes): calls
                # of as many sentences as the level's clients have in flight, the largest batches
                # the server can form from one-sentence requests. The server idles meanwhile.
                print(f"beam {beam}, {clients} clients ...", file=sys.stderr, flush=True)
                same = ceiling(translator, jobs, beam, clients)
                result["ceiling"][f"beam{beam}_batches_of_{clients}"] = same
                level = load(server.port, clients, jobs, beam, alignments=False)
                rate = level["sentences_per_sec"]
                level.update(vs_one_call=rate / one_call, vs_batches_of_clients=rate / same)
                result["server"].append(level)
    # The same calls while a second thread that has translated is alive (as a worker thread of a
    # server is): torch keeps an OpenMP pool for each, which is why the server runs every torch call
    # on one thread (seq2seq/serving/server.py). Last: a pool only goes when its thread ends.
    done = threading.Event()

    def second_thread(model: Any) -> None:
        model.translate(jobs[:8], beam=1)
        done.wait(TIMEOUT * len(jobs))

    other = threading.Thread(target=second_thread, args=(translator,), daemon=True)
    other.start()
    try:
        result["ceiling_with_second_thread"] = {
            f"beam1_batches_of_{size}": ceiling(translator, jobs, 1, size) for size in (1, 16)
        }
    finally:
        done.set()
        other.join()
    del translator
    print(f"memory over {args.memory_marks[1]} requests ...", file=sys.stderr, flush=True)
    result["memory"] = memory(args.checkpoint, args.device, sentences, tuple(args.memory_marks))
    text = json.dumps(result, indent=2)
    if args.json:
        atomic_write_text(args.json, text + "\n")  # whole or not at all
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
