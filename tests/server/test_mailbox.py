"""The engine thread's events reach the handlers' queues in order, a round's together."""

from __future__ import annotations

import asyncio
import threading

from ddtree_runtime.server.worker import Job, mailbox_of


class CountingLoop(asyncio.SelectorEventLoop):
    """asyncio's loop, counting the wake-ups other threads cause (writes to its self-pipe)."""

    wakeups = 0

    def _write_to_self(self) -> None:
        self.wakeups += 1
        super()._write_to_self()


def test_a_rounds_events_reach_every_queue_in_order_with_one_wakeup() -> None:
    loop = CountingLoop()
    queues = [asyncio.Queue[tuple[str, object]]() for _ in range(16)]
    box = mailbox_of(loop)
    assert mailbox_of(loop) is box  # every job on the loop shares it

    def engine_round(r: int) -> None:  # the engine thread: one event per stream
        for i, q in enumerate(queues):
            box.post(q, ("tokens", [r, i]))

    async def run() -> list[list[tuple[str, object]]]:
        for r in range(3):
            worker = threading.Thread(target=engine_round, args=(r,))
            worker.start()
            worker.join()  # the loop is not running meanwhile: the round's events wait together
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        return [[q.get_nowait() for _ in range(q.qsize())] for q in queues]

    got = loop.run_until_complete(run())
    loop.close()
    assert got == [[("tokens", [r, i]) for r in range(3)] for i in range(16)]
    assert loop.wakeups == 3  # one a round, not 16


def test_a_job_posts_through_its_loops_mailbox_and_a_closed_loop_drops_events() -> None:
    loop = asyncio.new_event_loop()
    job = Job(request=None, loop=loop)  # type: ignore[arg-type]
    job.put(("tokens", [1]))
    loop.run_until_complete(asyncio.sleep(0))
    assert job.events.get_nowait() == ("tokens", [1])
    loop.close()
    job.put(("tokens", [2]))  # the server has stopped: nobody waits, nothing raises
