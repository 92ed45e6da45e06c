"""A process that writes to a store and stops half way through a transaction, to be killed there (kill -9).

    python -m tests.store_writer URL batches     # commits batches 0, 1, ... of BATCH_ROWS rows each, with
                                                 # the counter row; prints "committed N" after each commit;
                                                 # inside batch `STOP_AT`, after half its rows, prints
                                                 # "mid N" and blocks (the transaction open) until killed
    python -m tests.store_writer URL fold        # the memory's real fold (gateway/llm/memory_store.py):
                                                 # its DELETE done, blocks before writing the summary

Used by tests/test_store_outage.py, which reads these lines and kills the process at "mid".
"""

from __future__ import annotations

import asyncio
import sys

from sqlalchemy import Column, Integer, MetaData, Table, insert, update

import gateway.llm.memory_store as memory_store
from gateway.llm.memory_store import MEMORY_SCHEMA, MemoryStore
from gateway.store import Schema, Store

BATCH_ROWS = 20
STOP_AT = 12

_md = MetaData()
rows = Table(
    "writer_rows",
    _md,
    Column("id", Integer, primary_key=True),
    Column("batch", Integer, nullable=False, index=True),
)
counter = Table(
    "writer_counter", _md, Column("id", Integer, primary_key=True), Column("last", Integer, nullable=False)
)
WRITER_SCHEMA = Schema("writer", (rows, counter))


def _say(line: str) -> None:
    print(line, flush=True)


def _block() -> None:
    """Holds the process (and its open transaction) until it is killed: a blocking read of stdin."""
    sys.stdin.readline()
    raise SystemExit("not killed")


async def batches(store: Store) -> None:
    async with store.write() as conn:
        await conn.execute(insert(counter).values(id=1, last=-1))
    for batch in range(STOP_AT + 1):
        async with store.write() as conn:
            for i in range(BATCH_ROWS):
                await conn.execute(insert(rows).values(batch=batch))
                if batch == STOP_AT and i == BATCH_ROWS // 2:
                    _say(f"mid {batch}")
                    _block()
            await conn.execute(update(counter).where(counter.c.id == 1).values(last=batch))
        _say(f"committed {batch}")


async def fold(store: Store) -> None:
    memory = MemoryStore(store)
    for i in range(10):
        await memory.append("dev", f"question {i}", f"answer {i}")
    _, up_to = await memory.oldest("dev", 6)
    _say(f"committed {up_to}")
    real_upsert = memory_store.upsert

    def pausing_upsert(*args, **kwargs):  # called inside fold's transaction, after its DELETE ran
        _say("mid fold")
        _block()
        return real_upsert(*args, **kwargs)

    memory_store.upsert = pausing_upsert  # type: ignore[assignment]
    await memory.fold("dev", up_to, "SUMMARY of questions 0-5")


async def main(url: str, mode: str) -> None:
    store = Store(url, schemas=[MEMORY_SCHEMA, WRITER_SCHEMA])
    await store.open()
    await (batches if mode == "batches" else fold)(store)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
