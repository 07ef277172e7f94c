"""The engine-core process: EngineCore behind two ZMQ sockets, so HTTP never blocks the forward loop.

Front end -> core (one PUSH socket):   ("add", rid, input_ids, sampling_params, return_logprob, top_logprobs_num,
                                        stream)
                                       ("abort", rid) | ("metrics", token) | ("shutdown",)
Core -> front end (one PUSH socket):   ("ready", info) | ("failed", message) at start-up
                                       ("ack", rid, None | error message) for every add, before any output of it
                                       ("out", [Update, ...]) once per step that produced anything
                                       ("metrics", token, EngineCore.metrics())

The loop drains every queued message without blocking while there is work, and blocks when idle. A request the
core refuses (InvalidRequest) is acked with its message; nothing a single request does stops the loop. A request
reports its first token at once, then every `stream_interval` tokens if it streams, else only when it finishes:
each update costs the front end work, and on a small machine the front end shares the cores with the forward.
"""

import logging
import os
import pickle
import signal
import time
from typing import NamedTuple

import zmq

from kestrel.config import ServerArgs

log = logging.getLogger(__name__)

# consecutive failing steps after which the core gives up (the front end then reports unhealthy)
MAX_STEP_FAILURES = 3
# an idle core that gets a request waits for the burst it may start: until 2 ms pass without one, 20 ms at most
GATHER_QUIET_MS, GATHER_MAX_MS = 2, 20


class Update(NamedTuple):
    """What one request gained since its previous update."""

    rid: str
    new_ids: list[int]
    new_logprobs: list[float]
    new_top_logprobs: list[list[tuple[int, float]]]
    finish_reason: dict | None
    cached_tokens: int
    spec_verify_ct: int = 0  # speculative verify steps and accepted draft tokens so far (meta_info)
    spec_accepted: int = 0


def send(sock: zmq.Socket, msg: tuple) -> None:
    sock.send(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def place_replica(args: ServerArgs, rank: int, threads: int, gpus: int) -> tuple[ServerArgs, int]:
    """(args, torch threads) for data-parallel replica `rank` of args.dp_size, on a host with `threads` torch
    threads and `gpus` CUDA devices. On GPUs replica r takes the r-th device from the one --device names; on a CPU
    the replicas split the threads (at least one each)."""
    if args.dp_size == 1:
        return args, threads
    device = args.device
    if device == "auto":
        device = "cuda" if gpus else "cpu"
    if device == "cpu":
        return args.replace(device="cpu"), max(1, threads // args.dp_size)
    base = int(device.partition(":")[2] or 0)
    if base + args.dp_size > gpus:
        raise ValueError(f"--dp-size {args.dp_size} from {device} needs GPUs {base}..{base + args.dp_size - 1}; "
                         f"this host has {gpus}")
    return args.replace(device=f"cuda:{base + rank}"), threads


def run(args: ServerArgs, to_core: str, from_core: str, parent_pid: int, dp_rank: int = 0) -> None:
    """Process entry point (multiprocessing spawn); dp_rank: which of --dp-size replicas this core is."""
    # Ctrl-C reaches the whole process group: the front end decides when the core stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit)
    name = f"core {dp_rank}" if args.dp_size > 1 else "core"
    logging.basicConfig(level=args.log_level.upper(), format=f"%(asctime)s %(levelname)s {name}: %(message)s")
    ctx = zmq.Context()
    inbox, outbox = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    for sock in (inbox, outbox):
        # no high-water mark: the forward loop never blocks on a busy front end
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
    inbox.connect(to_core)
    outbox.connect(from_core)
    core = None
    try:
        import torch

        from kestrel.engine.core import EngineCore

        if args.dp_size > 1:
            gpus = torch.cuda.device_count() if args.device != "cpu" else 0
            args, threads = place_replica(args, dp_rank, torch.get_num_threads(), gpus)
            torch.set_num_threads(threads)
            if args.resolved_device.type == "cuda":
                torch.cuda.set_device(args.resolved_device)
        core = EngineCore(args, dp_rank=dp_rank)
        info = {"model_name": core.model_name, "context_len": core.context_len, "vocab_size": core.cfg.vocab_size,
                "tokenizer": core.tokenizer, "pid": os.getpid(), "dp_rank": dp_rank,
                "device": str(core.runner.device), "threads": torch.get_num_threads()}
        send(outbox, ("ready", info))
        CoreLoop(core, inbox, outbox, parent_pid).run()
    except SystemExit:
        pass
    except Exception as e:  # noqa: BLE001 - reported to the front end, which exits or reports unhealthy
        log.exception("engine core failed")
        send(outbox, ("failed", f"{type(e).__name__}: {e}"))
    finally:
        if core is not None:
            core.shutdown()
        inbox.close(linger=0)
        outbox.close(linger=1000)
        ctx.term()


def _exit(*_) -> None:
    raise SystemExit(0)


class CoreLoop:
    def __init__(self, core, inbox: zmq.Socket, outbox: zmq.Socket, parent_pid: int):
        self.core, self.inbox, self.outbox, self.parent_pid = core, inbox, outbox, parent_pid
        # rid -> output tokens already sent; tokens between updates (0: only the first token and the finish)
        self.sent: dict[str, int] = {}
        self.interval: dict[str, int] = {}
        self.failures = 0
        self.running = True

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.inbox, zmq.POLLIN)
        while self.running:
            busy = self.core.has_work()
            # idle: block, waking each second to notice a front end that died without saying so
            if poller.poll(0 if busy else 1000):
                self._drain()
                if not busy:
                    self._gather(poller)
            elif not busy and os.getppid() != self.parent_pid:
                log.warning("the front end is gone; exiting")
                return
            if self.running and self.core.has_work():
                self._step()

    def _gather(self, poller: zmq.Poller) -> None:
        """An idle engine that just got work waits for the rest of the burst (clients replacing finished requests
        send them within milliseconds of each other) so that one prefill batch takes them all: it drains until
        the inbox is quiet for GATHER_QUIET_MS, GATHER_MAX_MS at most."""
        deadline = time.monotonic() + GATHER_MAX_MS / 1e3
        while self.running and time.monotonic() < deadline and poller.poll(GATHER_QUIET_MS):
            self._drain()

    def _drain(self) -> None:
        while self.running:
            try:
                msg = pickle.loads(self.inbox.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            getattr(self, "_on_" + msg[0])(*msg[1:])

    def _on_add(self, rid, input_ids, params, return_logprob, top_logprobs_num, stream) -> None:
        from kestrel.engine.sampling_params import InvalidRequest

        try:
            req = self.core.make_request(input_ids, params, rid, return_logprob, top_logprobs_num)
            self.core.add_request(req)
        except InvalidRequest as e:
            send(self.outbox, ("ack", rid, str(e)))
            return
        except Exception as e:  # noqa: BLE001 - a request that breaks admission fails alone
            log.exception("request %s failed at admission", rid)
            send(self.outbox, ("ack", rid, f"internal error: {type(e).__name__}: {e}"))
            return
        self.sent[rid] = 0
        self.interval[rid] = self.core.args.stream_interval if stream else 0
        send(self.outbox, ("ack", rid, None))

    def _on_abort(self, rid) -> None:
        if rid in self.sent:
            self.core.abort(rid, "aborted by the client")

    def _on_metrics(self, token) -> None:
        send(self.outbox, ("metrics", token, self.core.metrics()))

    def _on_shutdown(self) -> None:
        self.running = False

    def _step(self) -> None:
        try:
            updated = self.core.step()
            self.failures = 0
        except Exception as e:  # noqa: BLE001 - fail what is live, keep serving if the next steps work
            log.exception("engine step failed")
            self.failures += 1
            if self.failures >= MAX_STEP_FAILURES:
                raise
            for rid in list(self.sent):
                self.core.abort(rid, f"internal error: {type(e).__name__}: {e}")
            time.sleep(0.01)
            return
        updates = []
        for r in updated:
            if r.rid not in self.sent:
                continue
            k, every = self.sent[r.rid], self.interval[r.rid]
            new = len(r.output_ids) - k
            if not r.finished and k > 0 and (every == 0 or new < every):
                continue
            updates.append(Update(r.rid, r.output_ids[k:], r.output_logprobs[k:], r.output_top_logprobs[k:],
                                  r.finish_reason, r.cached_tokens, r.spec_verify_ct, r.spec_accepted))
            if r.finished:
                del self.sent[r.rid], self.interval[r.rid]
            else:
                self.sent[r.rid] = len(r.output_ids)
        if updates:
            send(self.outbox, ("out", updates))
