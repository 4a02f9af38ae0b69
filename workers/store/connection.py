"""One Redis (or Redis Cluster) connection, with what every part of the store shares.

`Connection` is what the sub-stores take, never `RunStore`: the client, the key
map (`workers.store.layout.Keys`), the one place where redis-py's errors become
`StoreUnavailable` (naming the URL with its password masked), and `run`, which
runs a Lua script call built by `workers.store.scripts`.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

import redis
from redis.exceptions import NoScriptError, RedisClusterException

from workers.errors import StoreMisconfigured, StoreUnavailable
from workers.redact import redact_url
from workers.store.cluster import cluster_url, connect
from workers.store.layout import Keys
from workers.store.ops import Batch, Emit, Op, Steps, answer_of
from workers.store.scripts import ScriptCall, lua

__all__ = ["Connection", "ping_url", "redis_errors"]

A = TypeVar("A")


class Connection:
    """A client of one Redis (or cluster), its keys, and its scripts; shared by threads."""

    def __init__(self, url: str, prefix: str, *, cluster: bool = False) -> None:
        self.url = url
        self.keys = Keys(prefix, cluster=cluster or cluster_url(url))
        # Typed Any: redis-py annotates every reply as a union over its sync and
        # async clients, which says nothing useful here.
        with self.errors():  # a cluster's client asks a node for the slots now
            self.redis: Any = connect(url, cluster=self.keys.cluster)
        self._scripts: dict[tuple[str, int], Any] = {}
        self._lock = threading.Lock()

    def errors(self) -> AbstractContextManager[None]:
        """A context in which redis-py's errors are raised as `StoreUnavailable`."""
        return _redis_errors(self.url)

    def run(self, call: ScriptCall[A], *, on: Any = None) -> A:
        """Run a script call and return its answer, read (`on`: a node's own client, for
        the one script that runs on each node of a cluster; default: this client)."""
        client = self.redis if on is None else on
        script = self._script(call.name, client)
        with self.errors():
            answer = script(keys=call.keys, args=call.args)
        return call.read(answer)

    def run_many(self, calls: Sequence[ScriptCall[A]]) -> list[A | StoreUnavailable]:
        """Run script calls in one round trip (a pipeline, not a transaction; one at a time
        on a cluster, whose pipelines do not load scripts); each one's answer, read, or
        the StoreUnavailable that refused it (all of them, if Redis cannot be reached)."""
        if self.keys.cluster or len(calls) < 2:
            found: list[A | StoreUnavailable] = []
            for call in calls:
                try:
                    found.append(self.run(call))
                except StoreUnavailable as error:
                    found.append(error)
            return found
        try:
            with self.errors():
                answers = self._pipelined(calls)
        except StoreUnavailable as error:
            return [error] * len(calls)
        return [
            StoreUnavailable(str(answer)) if isinstance(answer, Exception) else call.read(answer)
            for call, answer in zip(calls, answers, strict=True)
        ]

    def _pipelined(self, calls: Sequence[ScriptCall[A]]) -> list[Any]:
        """Each call's raw answer (or the error it met), all as EVALSHA in one pipeline.
        (redis-py's own pipelined scripts ask SCRIPT EXISTS before every pipeline: a round
        trip more each time.) The calls of a script Redis does not hold (it restarted, or
        its scripts were flushed) did not run: the script is loaded, and they are sent
        again, once."""
        scripts = [self._script(call.name, self.redis) for call in calls]
        answers = self._evalshas(calls, scripts)
        missing = [i for i, answer in enumerate(answers) if isinstance(answer, NoScriptError)]
        if missing:
            for script in {id(scripts[i]): scripts[i] for i in missing}.values():
                self.redis.script_load(script.script)
            again = self._evalshas([calls[i] for i in missing], [scripts[i] for i in missing])
            for i, answer in zip(missing, again, strict=True):
                answers[i] = answer
        return answers

    def _evalshas(self, calls: Sequence[ScriptCall[A]], scripts: Sequence[Any]) -> list[Any]:
        pipe = self.redis.pipeline(transaction=False)
        for call, script in zip(calls, scripts, strict=True):
            pipe.evalsha(script.sha, len(call.keys), *call.keys, *call.args)
        answers: list[Any] = pipe.execute(raise_on_error=False)
        return answers

    def _script(self, name: str, client: Any) -> Any:
        # A script is registered once per client: no round trip (EVALSHA, and the
        # source on the first NOSCRIPT).
        key = (name, id(client))
        with self._lock:
            script = self._scripts.get(key)
            if script is None:
                script = self._scripts[key] = client.register_script(lua(name))
        return script

    def drive(self, steps: Steps[A], on_emit: Callable[[Any], object] | None = None) -> A:
        """Run `steps` (workers.store.ops) on this client: each operation in turn, its
        answer sent back; return what they return. A value they emit goes to `on_emit`
        (dropped without one)."""
        answer: Any = None
        while True:
            with self.errors():
                try:
                    op = steps.send(answer)
                except StopIteration as done:
                    result: A = done.value
                    return result
                if not isinstance(op, Emit):
                    answer = answer_of(op, self.execute(op))
                    continue
            answer = None
            if on_emit is not None:
                on_emit(op.value)  # outside the errors' context: not Redis's doing

    def iterate(self, steps: Steps[A]) -> Iterator[Any]:
        """Run `steps` as `drive` does, yielding each value they emit as it comes."""
        answer: Any = None
        while True:
            with self.errors():
                try:
                    op = steps.send(answer)
                except StopIteration:
                    return
                if not isinstance(op, Emit):
                    answer = answer_of(op, self.execute(op))
                    continue
            answer = None
            yield op.value  # outside the errors' context: the consumer's own code runs here

    def execute(self, op: Op) -> Any:
        """What the client answers to one operation (a script's answer not yet read)."""
        if isinstance(op, ScriptCall):
            return self._script(op.name, self.redis)(keys=op.keys, args=op.args)
        if isinstance(op, Batch):
            pipe = self.redis.pipeline(transaction=op.transaction)
            for command in op.commands:
                pipe.execute_command(*command.args)
            return pipe.execute()
        assert not isinstance(op, Emit)
        return self.redis.execute_command(*op.args)

    def ping(self) -> None:
        with self.errors():
            self.redis.ping()


def _misconfiguration(error: BaseException, variable: str = "RELAY_REDIS_URL") -> str | None:
    """What is wrong with the Redis URL, when `error` says it is the URL that Redis (or the
    resolver) refused, with what to do about it; None for an error that may pass.

    redis-py raises AuthenticationError for NOAUTH, WRONGPASS and a failed AUTH, and a
    ResponseError for a SELECT of a database the server does not have; a host name that
    does not resolve is an OSError (EAI_NONAME) under its ConnectionError. A resolver
    that could not answer now (EAI_AGAIN) may answer later: not a misconfiguration.
    `variable` is where the URL came from, for the hint.
    """
    if isinstance(error, redis.AuthenticationError):
        return (
            f"authentication failed ({error}): set the password in {variable} as"
            " redis://:PASSWORD@host:port/db (redis://USER:PASSWORD@... for an ACL user)"
        )
    if isinstance(error, redis.ResponseError) and "DB index" in str(error):
        return (
            f"the database in the URL does not exist ({error}): the /N at the end of"
            f" {variable} must be below the server's `databases` setting (16 by default)"
        )
    cause = error.__cause__ or error.__context__
    if isinstance(cause, socket.gaierror) and cause.errno == socket.EAI_NONAME:
        return f"no such host ({error}): check the host name in {variable}"
    return None


def redis_errors(url: str) -> AbstractContextManager[None]:
    """A context in which redis-py's errors (sync or asyncio) become `StoreUnavailable`."""
    return _redis_errors(url)


def ping_url(url: str, variable: str) -> None:
    """Ask the Redis at `url` (from the setting `variable`) for one PONG, on a client of its
    own: StoreMisconfigured or StoreUnavailable, naming `variable`, when it does not."""
    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
    try:
        with _redis_errors(url, variable):
            client.ping()
    finally:
        client.close()


@contextmanager
def _redis_errors(url: str, variable: str = "RELAY_REDIS_URL") -> Iterator[None]:
    """Translate redis-py's errors into `StoreUnavailable` naming the URL without its
    password: `StoreMisconfigured` when the URL itself is what Redis refused."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as error:
        wrong = _misconfiguration(error, variable)
        if wrong is not None:
            raise StoreMisconfigured(f"Redis at {redact_url(url)}: {wrong}") from error
        if isinstance(error, redis.ResponseError):
            raise StoreUnavailable(f"Redis at {redact_url(url)} failed: {error}") from error
        raise StoreUnavailable(f"Redis at {redact_url(url)} is unreachable: {error}") from error
    except RedisClusterException as error:  # no node answered when the client was made
        raise StoreUnavailable(f"Redis at {redact_url(url)}: {error}") from error
    except redis.RedisError as error:
        raise StoreUnavailable(f"Redis at {redact_url(url)} failed: {error}") from error
