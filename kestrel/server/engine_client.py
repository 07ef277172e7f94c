"""The front end's side of the channel to the engine-core process (see engine_proc for the messages).

Every engine request has a Track: a mirror Req that the receive loop fills in as updates arrive, and the event of
the Group (one HTTP response's requests) that wakes the handler reading it. Updates that arrive while a handler
is busy pile up in the mirror, so a slow client gets several tokens per chunk instead of holding up the others.
"""

import asyncio
import functools
import logging
import multiprocessing
import os
import pickle
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from kestrel.config import ServerArgs
from kestrel.engine.core import merge_metrics
from kestrel.engine.request import Req
from kestrel.engine.sampling_params import InvalidRequest
from kestrel.server import engine_proc
from kestrel.server.metrics import ServerMetrics

log = logging.getLogger(__name__)



def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("a message to the engine core was not delivered: %r", fut.exception())

class EngineDead(Exception):
    """The engine core is gone (HTTP 503)."""


@dataclass(eq=False)
class Track:
    req: Req
    group: "Group"
    last_token_at: float | None = None
    rank: int = 0  # the data-parallel replica serving it

    @property
    def finished(self) -> bool:
        return self.req.finished


@dataclass(eq=False)
class Group:
    """One HTTP response's engine requests (n choices times prompts)."""

    id: str
    client: "EngineClient"
    tracks: list[Track] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    error: str | None = None  # set when the engine core died under it

    @property
    def finished(self) -> bool:
        return self.error is not None or all(t.finished for t in self.tracks)

    async def changes(self):
        """Yields each time some track changed, until all have finished (raises EngineDead if the core died)."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            if self.error is not None:
                raise EngineDead(self.error)
            yield
            if self.finished:
                return

    async def wait(self) -> None:
        async for _ in self.changes():
            pass

    def abort(self) -> None:
        """Abort the unfinished requests (a client that went away); their memory is freed by the core."""
        for t in self.tracks:
            if not t.finished:
                self.client.abort(t.req.rid)
        self.client.groups.pop(self.id, None)


class EngineClient:
    """The channel to the engine core, or to --dp-size of them: one inbox each, one shared outbox. Each request
    goes to one replica (--load-balance-method), which serves it to the end; metrics are summed over them."""

    def __init__(self, args: ServerArgs):
        self.args = args
        n = args.dp_size
        # ipc sockets in a private directory (mkdtemp makes it 0700)
        self.sock_dir = tempfile.mkdtemp(prefix="kestrel-")
        self.ctx = zmq.asyncio.Context()
        self.to_cores = [self.ctx.socket(zmq.PUSH) for _ in range(n)]
        self.from_core = self.ctx.socket(zmq.PULL)
        # no high-water mark: a burst of requests queues for the core instead of failing (or blocking) the sender
        for sock in (*self.to_cores, self.from_core):
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
        for r, sock in enumerate(self.to_cores):
            sock.bind(f"ipc://{self.sock_dir}/to_core{r}")
        self.from_core.bind(f"ipc://{self.sock_dir}/from_core")
        spawn = multiprocessing.get_context("spawn")
        self.procs = [spawn.Process(target=engine_proc.run, name="kestrel-core" + (f"-{r}" if n > 1 else ""),
                                    daemon=True, args=(args, f"ipc://{self.sock_dir}/to_core{r}",
                                                       f"ipc://{self.sock_dir}/from_core", os.getpid(), r))
                      for r in range(n)]
        self.load = [0] * n  # unfinished requests per replica
        self._next = 0  # round robin's next replica
        self.info: dict = {}
        self.replica_info: list[dict] = []
        self.metrics: ServerMetrics | None = None
        self.tracks: dict[str, Track] = {}
        self.groups: dict[str, Group] = {}
        self.acks: dict[str, asyncio.Future] = {}
        self.metric_waiters: dict[str, asyncio.Future] = {}
        self.dead: str | None = None
        self._recv_task: asyncio.Task | None = None

    # ---- life cycle
    async def start(self) -> dict:
        """Spawn the core and wait until it has loaded the model; returns its info (model name, context length,
        vocabulary size, tokenizer)."""
        for proc in self.procs:
            proc.start()
        infos: dict[int, dict] = {}
        while len(infos) < len(self.procs):
            first = asyncio.ensure_future(self.from_core.recv())
            while not (await asyncio.wait({first}, timeout=0.5))[0]:
                gone = next((p for p in self.procs if not p.is_alive()), None)
                if gone is not None:
                    first.cancel()
                    self._stop_starting()
                    raise RuntimeError(f"the engine core exited with code {gone.exitcode} while starting")
            kind, payload = pickle.loads(first.result())
            if kind == "failed":
                self._stop_starting()
                raise RuntimeError(f"the engine core failed to start: {payload}")
            infos[payload["dp_rank"]] = payload
        self.info = infos[0]
        self.replica_info = [infos[r] for r in range(len(self.procs))]
        if len(self.procs) > 1:
            log.info("%d replicas: %s", len(self.procs), ", ".join(
                f"{i['dp_rank']} on {i['device']} ({i['threads']} threads)" for i in self.replica_info))
        self.metrics = ServerMetrics(self.info["model_name"])
        self._recv_task = asyncio.create_task(self._receive())
        for proc in self.procs:
            asyncio.get_running_loop().add_reader(proc.sentinel, functools.partial(self._on_core_exit, proc))
        return self.info

    def _stop_starting(self) -> None:
        """A replica failed to start: the others go too."""
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
            proc.join(10)

    @property
    def alive(self) -> bool:
        return self.dead is None and all(p.is_alive() for p in self.procs)

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the core (it finishes its step, then exits), join it, close the sockets."""
        for proc in self.procs:
            if proc.pid is not None:
                try:
                    asyncio.get_running_loop().remove_reader(proc.sentinel)
                except (ValueError, OSError):
                    pass
        self.fail_all("the server is shutting down")
        live = [(r, p) for r, p in enumerate(self.procs) if p.is_alive()]
        for r, _ in live:
            try:
                self._send(("shutdown",), r)
            except EngineDead:
                pass
        for _, proc in live:  # each finishes its step, then exits
            await asyncio.to_thread(proc.join, timeout)
            if proc.is_alive():
                log.warning("the engine core did not stop in %.0f s; terminating it", timeout)
                proc.terminate()
                await asyncio.to_thread(proc.join, 5)
        if self._recv_task is not None:
            self._recv_task.cancel()
        for sock in self.to_cores:
            sock.close(linger=0)
        self.from_core.close(linger=0)
        self.ctx.term()
        shutil.rmtree(self.sock_dir, ignore_errors=True)

    def fail_all(self, message: str) -> None:
        """Fail every live request (the core died, or the server is going down)."""
        self.dead = self.dead or message
        for fut in [*self.acks.values(), *self.metric_waiters.values()]:
            if not fut.done():
                fut.set_exception(EngineDead(message))
        for g in list(self.groups.values()):
            g.error = message
            g.wake.set()

    def _on_core_exit(self, proc) -> None:
        asyncio.get_running_loop().remove_reader(proc.sentinel)
        proc.join(1)
        log.error("the engine core %s exited (code %s)", proc.name, proc.exitcode)
        self.fail_all(f"the engine core exited (code {proc.exitcode})")

    # ---- requests
    async def submit(self, reqs: list[Req], group_id: str | None = None, stream: bool = True) -> Group:
        """Send reqs to the core and wait for its verdict on each; raises InvalidRequest (naming the first
        refusal, the others aborted) or EngineDead. Without `stream` the core reports only the first token and
        the finish."""
        if not self.alive:
            raise EngineDead(self.dead or "the engine core is not running")
        assert all(r.rid for r in reqs), "the core names a request without a rid itself"
        group = Group(group_id or uuid.uuid4().hex, self)
        taken = [r.rid for r in reqs if r.rid in self.tracks] + ([group.id] if group.id in self.groups else [])
        if taken or len({r.rid for r in reqs}) < len(reqs):
            raise InvalidRequest(f"request id {taken[0] if taken else reqs[0].rid!r} is already in use")
        loop = asyncio.get_running_loop()
        futures = []
        self.groups[group.id] = group
        for r in reqs:
            group.tracks.append(Track(r, group, rank=self._pick()))
            self.tracks[r.rid] = group.tracks[-1]
            self.load[group.tracks[-1].rank] += 1
            self.acks[r.rid] = fut = loop.create_future()
            futures.append(fut)
        try:
            for t in group.tracks:
                r = t.req
                self._send(("add", r.rid, r.prompt_ids, r.params, r.return_logprob, r.top_logprobs_num, stream),
                           t.rank)
        except EngineDead as e:
            for r, fut in zip(reqs, futures):
                if not fut.done():
                    fut.set_exception(e)
                self.acks.pop(r.rid, None)
        verdicts = await asyncio.gather(*futures, return_exceptions=True)
        dead = next((v for v in verdicts if isinstance(v, BaseException)), None)
        refused = next((v for v in verdicts if isinstance(v, str)), None)
        if dead is not None or refused is not None:
            for r, v in zip(reqs, verdicts):
                if v is None:
                    self.abort(r.rid)
                else:
                    self._untrack(r.rid)
            self.groups.pop(group.id, None)
            if dead is not None:
                raise dead
            raise InvalidRequest(refused)
        return group

    def _pick(self) -> int:
        """The replica for a new request."""
        if self.args.load_balance_method == "shortest_queue":
            return min(range(len(self.load)), key=self.load.__getitem__)
        r, self._next = self._next, (self._next + 1) % len(self.procs)
        return r

    def _untrack(self, rid: str) -> Track | None:
        track = self.tracks.pop(rid, None)
        if track is not None:
            self.load[track.rank] -= 1
        return track

    def abort(self, rid: str) -> None:
        if self.alive:
            track = self.tracks.get(rid)
            try:
                for r in [track.rank] if track is not None else range(len(self.procs)):
                    self._send(("abort", rid), r)
            except EngineDead:
                pass  # the core is gone, and its requests with it

    def abort_group_or_request(self, rid: str) -> bool:
        if rid in self.groups:
            self.groups[rid].abort()
            return True
        if rid in self.tracks:
            self.abort(rid)
            return True
        return False

    async def core_metrics(self, timeout: float = 10.0) -> dict:
        if not self.alive:
            raise EngineDead(self.dead or "the engine core is not running")
        tokens = [f"{uuid.uuid4().hex}.{r}" for r in range(len(self.procs))]
        loop = asyncio.get_running_loop()
        futures = []
        for r, token in enumerate(tokens):
            self.metric_waiters[token] = fut = loop.create_future()
            futures.append(fut)
            self._send(("metrics", token), r)
        try:
            return merge_metrics(await asyncio.wait_for(asyncio.gather(*futures), timeout))
        finally:
            for token in tokens:
                self.metric_waiters.pop(token, None)

    def _send(self, msg: tuple, rank: int = 0) -> None:
        # NOBLOCK: with no high-water mark this never waits while the core is connected
        try:
            sent = self.to_cores[rank].send(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL), zmq.NOBLOCK)
        except zmq.Again as e:  # no core on the other end
            raise EngineDead("the engine core is not reachable") from e
        if isinstance(sent, asyncio.Future):
            # the asyncio socket may report a peer that is gone on the future instead: the core's death is handled
            # by its process sentinel, so only retrieve it (else asyncio logs it at exit)
            if sent.done():  # a callback would wait for a loop turn that shutdown may never give it
                _retrieve(sent)
            else:
                sent.add_done_callback(_retrieve)

    # ---- the receive loop
    async def _receive(self) -> None:
        while True:
            try:
                msg = pickle.loads(await self.from_core.recv())
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001
                log.exception("bad message from the engine core")
                continue
            kind = msg[0]
            if kind == "out":
                self._apply(msg[1])
            elif kind == "ack":
                fut = self.acks.pop(msg[1], None)
                if fut is not None and not fut.done():
                    fut.set_result(msg[2])
            elif kind == "metrics":
                fut = self.metric_waiters.get(msg[1])
                if fut is not None and not fut.done():
                    fut.set_result(msg[2])
            elif kind == "failed":
                log.error("the engine core failed: %s", msg[1])
                self.fail_all(f"the engine core failed: {msg[1]}")

    def _apply(self, updates: list[engine_proc.Update]) -> None:
        now = time.monotonic()
        for u in updates:
            track = self.tracks.get(u.rid)
            if track is None:
                continue
            r = track.req
            r.cached_tokens, r.spec_verify_ct, r.spec_accepted = u.cached_tokens, u.spec_verify_ct, u.spec_accepted
            if u.new_ids:
                self.metrics.on_tokens(r, track.last_token_at, now, len(u.new_ids))
                track.last_token_at = now
                if r.first_token_at is None:
                    r.first_token_at = now
                r.output_ids.extend(u.new_ids)
                r.output_logprobs.extend(u.new_logprobs)
                r.output_top_logprobs.extend(u.new_top_logprobs)
            if u.finish_reason is not None:
                r.finish_reason, r.finished_at = u.finish_reason, now
                self.metrics.on_finish(r, now)
                self._untrack(u.rid)
                if track.group.finished:
                    self.groups.pop(track.group.id, None)
            track.group.wake.set()
