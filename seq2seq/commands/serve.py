"""Serve checkpoints: `seq2seq serve CKPT [CKPT ...] [--port 8000]` (or `python scripts/serve.py`),
then open the page.

One process loads each checkpoint once and serves, at http://HOST:PORT/, the attention explorer (a
sentence in; each model's translation, attention heatmap and word alignment side by side) and the
JSON API described in seq2seq/serving/server.py and docs/guides/serving.md. Models are named after their files
(`additive.ckpt` -> additive; a repeated name gets -2, -3, ...). Needs `pip install -e ".[serve]"`.

Every checkpoint is loaded before the port is opened: one that cannot be read stops the start with
one `error:` line and exit status 2, and so does a port that is taken.

SIGTERM (or Ctrl-C) stops the server within STOP_BOUND seconds: queued requests are answered at
once with 503 ("shutting down", with a request id), the running batch ends at its next step, and
a request still open after GRACE seconds is answered 503 too, never left without an answer.
"""

import argparse
import dataclasses
import logging
import socket
import sys
import threading
from pathlib import Path

from seq2seq.cli import DefaultsFormatter, Parser, add_flags, cli_message
from seq2seq.decoding.flags import pick_device
from seq2seq.errors import UserError
from seq2seq.serving.requests import Limits

GRACE = 5  # seconds uvicorn waits for open requests after SIGTERM before it cancels them
# The seconds from SIGTERM to exit (docs/guides/serving.md; tests/e2e/test_serve_guards.py).
STOP_BOUND = 10


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog,
        description="Serve checkpoints: an attention explorer page at / and a JSON API under "
        "/api (docs/guides/serving.md). Requests for a model are queued and translated in batches.",
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument("checkpoints", metavar="CKPT", nargs="+", help="checkpoints to serve")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)"
    )
    parser.add_argument("--port", type=port, default=8000, help="port to listen on (0: any free)")
    parser.add_argument(
        "--device", default="auto", help="cpu, cuda, cuda:1, ... (auto: cuda if available)"
    )
    add_flags(parser, Limits)
    parser.add_argument(
        "--allow-origin", action="append", default=[], metavar="ORIGIN",
        help="a site whose pages may call the API from a browser, as https://example.org (CORS; "
        "repeat for more); without it no answer carries CORS headers",
    )  # fmt: skip
    parser.add_argument(
        "--allow-host", action="append", default=[], metavar="NAME",
        help="a name besides localhost, 127.0.0.1, [::1] and --host that requests may give in "
        "their Host header (repeat for more; * for any); others get 400",
    )  # fmt: skip
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                        help="uvicorn's log level (info: one line per request)")  # fmt: skip
    return parser


def port(text: str) -> int:
    """An argparse `type`: a TCP port, 0 to 65535 (the socket layer takes 70000 as 4464)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value}: a port is 0 to 65535")
    return value


def model_names(paths: list[str]) -> list[str]:
    """File stems, made unique in order: a.ckpt, b.ckpt, a.ckpt -> a, b, a-2."""
    names: list[str] = []
    for path in paths:
        stem, name, n = Path(path).stem, Path(path).stem, 1
        while name in names:
            n += 1
            name = f"{stem}-{n}"
        names.append(name)
    return names


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(argv)
    # the server's own errors, logged with their tracebacks and request ids (uvicorn logs the rest)
    logging.basicConfig(format="%(levelname)s: %(name)s: %(message)s")
    try:
        limits = Limits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Limits)})
        app = load(args, limits)
        sock = listen(args.host, args.port)
    except UserError as err:
        print(f"error: {cli_message(err)}", file=sys.stderr)
        return 2
    host, port = sock.getsockname()[:2]
    print(f"serving {len(args.checkpoints)} model(s) at http://{host}:{port}/", flush=True)
    run(app, sock, args.log_level)
    return 0


def load(args: argparse.Namespace, limits: Limits) -> "FastAPI":  # noqa: F821
    """The app over every checkpoint, loaded once; the first that cannot be loaded is a UserError."""
    try:
        from seq2seq.serving.hosts import known_names
        from seq2seq.serving.server import TorchThread, build_app
    except ImportError as err:
        raise UserError(f'{err.name} is missing: pip install -e ".[serve]"') from None
    from seq2seq.decoding.translator import Translator

    device = pick_device(args.device)
    torch_thread = TorchThread()  # loads the models and runs them: one thread for every torch call
    try:
        translators = {
            name: torch_thread.call(Translator.load, path, device)  # a UserError names the file
            for name, path in zip(model_names(args.checkpoints), args.checkpoints, strict=True)
        }
    except BaseException:
        torch_thread.close()
        raise
    hosts = known_names(args.host, tuple(args.allow_host))
    return build_app(translators, limits, torch_thread, args.allow_origin, hosts)


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) and listening; a UserError if the address cannot be had."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        # proto IPPROTO_TCP, not 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
        # connections whose socket says TCP, and with it on, a keep-alive client waited 40 ms for
        # each answer's body (sent after its headers, behind the delayed ACK of the client).
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as err:
        raise UserError(f"--host {host} --port {port}: cannot listen ({err.strerror})") from None
    return sock


def run(app: "FastAPI", sock: socket.socket, log_level: str) -> None:  # noqa: F821
    """Serve `app` on `sock` until Ctrl-C or SIGTERM (the module docstring says how it stops)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            # in a thread: a signal handler may run while the batchers' lock is held
            threading.Thread(target=app.state.stop, name="stop", daemon=True).start()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=GRACE)
    Server(config).run(sockets=[sock])
