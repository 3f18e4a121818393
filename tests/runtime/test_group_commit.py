"""Group commit on a real Redis: every thread gets its own reply, in fewer round trips."""

from __future__ import annotations

import ctypes
import random
import threading
import time
import uuid
from typing import Any

import pytest

from ojs_adapters.runtime.group_commit import GroupCommit, group_of, run_script

#: Appends ARGV[1] to the list KEYS[1] and returns the list's new length.
_PUSH = "return redis.call('RPUSH', KEYS[1], ARGV[1])"



class _Gated:
    """A real client whose first ``evalsha`` waits for ``gate``: calls queue up meanwhile."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.connection_pool = client.connection_pool
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.pipelines: list[int] = []

    def evalsha(self, *args: Any) -> Any:
        self.entered.set()
        self.gate.wait(10)
        return self.client.evalsha(*args)

    def script_load(self, lua: str) -> Any:
        return self.client.script_load(lua)

    def pipeline(self, transaction: bool = True) -> Any:
        pipe = self.client.pipeline(transaction=transaction)
        execute = pipe.execute

        def counted(raise_on_error: bool = True) -> Any:
            self.pipelines.append(len(pipe.command_stack))
            return execute(raise_on_error=raise_on_error)

        pipe.execute = counted
        return pipe


def _wait_queued(client: Any, calls: int) -> None:
    deadline = time.monotonic() + 10
    while len(group_of(client)._queue) < calls:
        assert time.monotonic() < deadline, "calls did not queue behind the leader"
        time.sleep(0.01)


def test_overlapping_calls_share_one_pipeline_and_each_gets_its_own_reply(
        client: Any, key: str) -> None:
    gated = _Gated(client)
    replies: dict[int, Any] = {}

    def call(n: int) -> None:
        replies[n] = run_script(gated, _PUSH, [key], [n])

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert gated.entered.wait(5)  # the leader is on the wire; the others queue behind it
    others = [threading.Thread(target=call, args=(n,)) for n in range(1, 9)]
    for thread in others:
        thread.start()
    _wait_queued(gated, 8)  # behind the leader's flush
    gated.gate.set()
    for thread in (first, *others):
        thread.join(10)
    assert gated.pipelines == [8]  # one round trip for the eight that overlapped
    pushed = [int(x) for x in client.lrange(key, 0, -1)]
    assert sorted(pushed) == list(range(9))
    # each caller got the length the list had right after its own push
    assert all(replies[n] == pushed.index(n) + 1 for n in range(9))


def test_a_script_redis_has_not_seen_is_loaded_and_sent_again(client: Any, key: str) -> None:
    fresh = f"-- {uuid.uuid4().hex}\n{_PUSH}"  # never loaded: EVALSHA answers NOSCRIPT
    assert run_script(client, fresh, [key], ["a"]) == 1
    assert run_script(client, fresh, [key], ["b"]) == 2


def test_an_error_reaches_only_the_call_that_caused_it(client: Any, key: str) -> None:
    gated = _Gated(client)
    client.set(key + ":str", "x")
    outcomes: dict[str, Any] = {}

    def call(name: str, target: str) -> None:
        try:
            outcomes[name] = run_script(gated, _PUSH, [target], [name])
        except Exception as error:
            outcomes[name] = error

    first = threading.Thread(target=call, args=("lead", key))
    first.start()
    assert gated.entered.wait(5)
    wrong = threading.Thread(target=call, args=("wrong", key + ":str"))  # WRONGTYPE
    right = threading.Thread(target=call, args=("right", key))
    wrong.start()
    right.start()
    _wait_queued(gated, 2)
    gated.gate.set()
    for thread in (first, wrong, right):
        thread.join(10)
    client.delete(key + ":str")
    assert outcomes["lead"] == 1 and outcomes["right"] == 2
    assert "WRONGTYPE" in str(outcomes["wrong"])


def test_threads_hammering_one_key_lose_no_call(client: Any, key: str) -> None:
    def worker(n: int) -> None:
        for i in range(200):
            run_script(client, _PUSH, [key], [f"{n}-{i}"])

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert client.llen(key) == 1200
    assert group_of(client)._baton is None and not group_of(client)._queue


class _Interrupt(BaseException):
    """What Dramatiq's ``TimeLimit`` raises into a worker thread (an ``Interrupt``)."""


def _interrupt(thread: threading.Thread) -> None:
    """Raise ``_Interrupt`` in ``thread`` at its next bytecode, as ``TimeLimit`` does."""
    assert thread.ident is not None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                               ctypes.py_object(_Interrupt))


def _calls(gated: Any, key: str, outcomes: dict[str, Any]) -> Any:
    def call(name: str) -> None:
        try:
            outcomes[name] = run_script(gated, _PUSH, [key], [name])
        except BaseException as error:  # the test reads what each one got
            outcomes[name] = error
    return call


def test_a_caller_interrupted_in_the_queue_hands_the_lead_on(client: Any, key: str) -> None:
    gated = _Gated(client)
    outcomes: dict[str, Any] = {}
    call = _calls(gated, key, outcomes)
    lead = threading.Thread(target=call, args=("lead",))
    lead.start()
    assert gated.entered.wait(5)
    queued = threading.Thread(target=call, args=("queued",))
    queued.start()
    _wait_queued(gated, 1)
    _interrupt(queued)  # lands once the leader wakes it to lead the next flush
    gated.gate.set()
    lead.join(10)
    queued.join(10)
    assert outcomes["lead"] == 1 and isinstance(outcomes["queued"], _Interrupt)
    after = threading.Thread(target=call, args=("after",))
    after.start()
    after.join(10)
    assert outcomes["after"] == 2  # the group has a leader again: nothing hangs
    assert group_of(gated)._baton is None and not group_of(gated)._queue


def test_a_leader_interrupted_mid_flush_leaves_the_others_a_connection_error(
        client: Any, key: str) -> None:
    gated = _Gated(client)
    in_flush, flush_gate = threading.Event(), threading.Event()
    pipeline = gated.pipeline

    def slow_pipeline(transaction: bool = True) -> Any:
        pipe = pipeline(transaction)
        execute = pipe.execute

        def held(raise_on_error: bool = True) -> Any:
            in_flush.set()
            while not flush_gate.is_set():  # Python code: the interrupt lands here
                time.sleep(0.01)
            return execute(raise_on_error=raise_on_error)

        pipe.execute = held
        return pipe

    gated.pipeline = slow_pipeline  # type: ignore[method-assign]
    outcomes: dict[str, Any] = {}
    call = _calls(gated, key, outcomes)
    threads = {name: threading.Thread(target=call, args=(name,))
               for name in ("alone", "leader", "other")}
    threads["alone"].start()
    assert gated.entered.wait(5)
    threads["leader"].start()
    _wait_queued(gated, 1)
    threads["other"].start()
    _wait_queued(gated, 2)
    gated.gate.set()  # "alone" returns; "leader" flushes itself and "other" in one pipeline
    assert in_flush.wait(10)
    _interrupt(threads["leader"])
    for thread in threads.values():
        thread.join(10)
    assert isinstance(outcomes["leader"], _Interrupt)  # raised in its own thread only
    assert isinstance(outcomes["other"], ConnectionError)  # retried by its caller
    assert group_of(gated)._baton is None and not group_of(gated)._queue
    assert run_script(gated, _PUSH, [key], ["after"]) == 2  # only "alone" had pushed


def test_an_interrupt_in_the_hand_on_still_hands_the_lead_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception raised into the thread just as it hands the lead on: the hand-on is
    done anyway (then the exception goes on up), or every later caller would wait."""
    group = GroupCommit()
    real, raised = GroupCommit._hand_on, []

    def cut_once(self: GroupCommit, holder: Any) -> None:
        if not raised:
            raised.append(True)
            raise _Interrupt
        real(self, holder)

    monkeypatch.setattr(GroupCommit, "_hand_on", cut_once)
    with pytest.raises(_Interrupt):
        group.run(_Quick(), "return 1", [], [])
    assert group._baton is None  # idle: the next caller goes straight out
    assert group.run(_Quick(), "return 1", [], []) == "ok"


class _Quick:
    """A client without redis-py's pool (``evalsha`` path) that answers at once."""

    def evalsha(self, *_args: Any) -> str:
        return "ok"

    def script_load(self, lua: str) -> None: ...

    def pipeline(self, transaction: bool = True) -> Any:
        calls: list[Any] = []

        class _Pipe:
            def evalsha(self, *args: Any) -> None:
                calls.append(args)

            def execute(self, raise_on_error: bool = True) -> list[str]:
                return ["ok"] * len(calls)

        return _Pipe()


def test_callers_interrupted_anywhere_leave_the_group_working() -> None:
    """Six threads share a group while exceptions are raised into them at random points
    (as ``TimeLimit`` would, far more often): afterwards every thread still gets through."""
    group, client = GroupCommit(), _Quick()
    stop, inside = threading.Event(), [False] * 6
    done, left = [0] * 6, list[int]()

    def caller(n: int) -> None:
        try:
            while not stop.is_set():
                try:
                    inside[n] = True
                    group.run(client, "return 1", [], [])
                    inside[n] = False
                    done[n] += 1
                except (_Interrupt, ConnectionError):
                    inside[n] = False
        except BaseException:  # an interrupt that landed outside the call: this test's own
            left.append(n)

    threads = [threading.Thread(target=caller, args=(n,), daemon=True) for n in range(6)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        n = random.randrange(6)
        if inside[n]:
            _interrupt(threads[n])
        time.sleep(random.random() * 0.001)
    time.sleep(0.05)
    before = list(done)
    time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join(5)
    assert not any(thread.is_alive() for thread in threads), "a caller waits for ever"
    running = [n for n in range(6) if n not in left]
    assert len(running) >= 3 and all(done[n] > before[n] for n in running), \
        "the group stopped answering"


def test_clients_share_a_group_only_when_their_settings_name_one_server() -> None:
    """Two Sentinel services look alike in their pools' settings (no host: the master is
    found at connect time); a shared group would send one service's scripts to the other's
    master. Plain clients of one server share one (Celery's per-thread backends)."""
    import redis
    from redis.sentinel import Sentinel

    sentinel = Sentinel([("127.0.0.1", 1)])
    jobs, records = sentinel.master_for("jobs"), sentinel.master_for("records")
    assert group_of(jobs) is not group_of(records)
    assert group_of(jobs) is group_of(Sentinel([("127.0.0.1", 1)]).master_for("jobs"))
    assert group_of(jobs) is not group_of(Sentinel([("127.0.0.1", 2)]).master_for("jobs"))
    assert group_of(jobs) is not group_of(sentinel.slave_for("jobs"))  # a replica's
    two = Sentinel([("127.0.0.2", 1), ("127.0.0.1", 1)])  # the same sentinels, listed apart
    assert group_of(two.master_for("jobs")) is group_of(
        Sentinel([("127.0.0.1", 1), ("127.0.0.2", 1)]).master_for("jobs"))
    a, b = redis.Redis(host="127.0.0.1", port=1, db=3), redis.Redis(host="127.0.0.1", port=1, db=3)
    assert group_of(a) is group_of(b)
    assert group_of(a) is not group_of(redis.Redis(host="127.0.0.1", port=1, db=4))

    class Provider(redis.CredentialProvider):
        def __init__(self, user: str) -> None:
            self.user = user

        def get_credentials(self) -> tuple[str, str]:
            return self.user, "secret"

    alice = redis.Redis(host="127.0.0.1", port=1, credential_provider=Provider("alice"))
    bob = redis.Redis(host="127.0.0.1", port=1, credential_provider=Provider("bob"))
    assert group_of(alice) is not group_of(bob)


def test_a_flush_cut_short_gives_the_answered_scripts_their_replies(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection lost after some scripts of a batch answered, the client's retries
    spent: those scripts ran, so their callers get their replies instead of an error (and
    do not run them again alone); the others get the error."""
    import redis

    from ojs_adapters.runtime import group_commit, redis_wire

    def cut_short(line: Any, pool: Any, scripts: Any) -> list[Any]:
        error = redis.ConnectionError("dropped")
        unknown = redis.exceptions.NoScriptError("NOSCRIPT No matching script")
        setattr(error, redis_wire._ANSWERED, [b"first", unknown])
        raise error

    monkeypatch.setattr(group_commit, "_on_wire", cut_short)
    calls = [group_commit._Call(redis.Redis(port=1), "return 1", [], []) for _ in range(3)]
    GroupCommit()._flush(calls)
    assert calls[0].reply == b"first" and calls[0].error is None
    assert isinstance(calls[1].error, redis.ConnectionError)  # NOSCRIPT: it did not run
    assert isinstance(calls[2].error, redis.ConnectionError)


def test_an_exception_raised_into_the_leader_mid_flush_leaves_answered_replies(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Dramatiq's time limit raises into the leader while it reads replies: the scripts
    that answered ran, so their callers get their replies; the rest get a lost connection
    (they retry alone), and the exception goes on up in the leader."""
    import redis

    from ojs_adapters.runtime import group_commit, redis_wire

    class TimeLimit(BaseException):
        pass

    def interrupted(line: Any, pool: Any, scripts: Any) -> list[Any]:
        error = TimeLimit()
        redis_wire.set_answered(error, [b"ran", redis.ResponseError("script failed")])
        raise error

    monkeypatch.setattr(group_commit, "_on_wire", interrupted)
    group = GroupCommit()
    calls = [group_commit._Call(redis.Redis(port=1), "return 1", [], []) for _ in range(3)]
    group._queue = list(calls)
    with pytest.raises(TimeLimit):
        group._lead(calls[0])
    assert calls[0].reply == b"ran" and calls[0].error is None
    assert isinstance(calls[1].error, redis.ResponseError)  # its own reply: it ran, and failed
    assert isinstance(calls[2].error, ConnectionError) and calls[2].done


def test_a_script_resend_cut_short_keeps_the_replies_it_read() -> None:
    """Redis had lost the scripts (NOSCRIPT): loaded and sent again, the link lost before
    the last reply. The script that answered ran; only the other gets the error."""
    import redis

    from ojs_adapters.runtime import group_commit, redis_wire

    class Line:
        def __init__(self) -> None:
            self.sends = 0

        def send(self, pool: Any, commands: Any) -> list[Any]:
            self.sends += 1
            unknown = redis.exceptions.NoScriptError("NOSCRIPT No matching script")
            if self.sends == 1:
                return [unknown, unknown, b"c-ok"]
            error = redis.ConnectionError("dropped")
            redis_wire.set_answered(error, [b"sha-a", b"sha-b", b"a-ran"])
            raise error

    scripts = [("return 'a'", [], []), ("return 'b'", [], []), ("return 'c'", [], [])]
    replies = group_commit._on_wire(Line(), None, scripts)  # type: ignore[arg-type]
    assert replies[0] == b"a-ran" and replies[2] == b"c-ok"
    assert isinstance(replies[1], redis.ConnectionError)


def test_an_exception_raised_into_the_leader_after_the_replies_came_keeps_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reply was read, and the exception lands as they are handed out: all ran."""
    import redis

    from ojs_adapters.runtime import group_commit

    class TimeLimit(BaseException):
        pass

    def interrupted(batch: Any, replies: Any, pool: Any) -> None:
        raise TimeLimit

    monkeypatch.setattr(group_commit, "_on_wire", lambda line, pool, scripts: [b"a", b"b"])
    monkeypatch.setattr(GroupCommit, "_give", staticmethod(interrupted))
    group = GroupCommit()
    calls = [group_commit._Call(redis.Redis(port=1), "return 1", [], []) for _ in range(2)]
    group._queue = list(calls)
    with pytest.raises(TimeLimit):
        group._lead(calls[0])
    assert [c.reply for c in calls] == [b"a", b"b"] and all(c.done for c in calls)
