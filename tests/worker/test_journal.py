"""The worker's journal (``streams/journal.py``): a batch's record says which messages it applied
in which order; read back, only well-formed records count, each batch once; the input read again
is taken by a record's runs, the rest left in order."""

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairstream.streams.journal import RangeBuffer, journal_record, record_runs, unique_records
from fairstream.streams.processor import Incoming


def message(position: str, offset: int) -> Incoming:
    topic, _, partition = position.rpartition(":")
    return Incoming("submitted", b"{}", topic, int(partition), offset)


@pytest.mark.parametrize("applied, runs", [
    pytest.param([("s:0", 4), ("s:0", 5), ("s:0", 6)], [["s:0", 4, 6]], id="consecutive messages of a position are one run"),
    pytest.param([("s:0", 4), ("s:0", 9)], [["s:0", 4, 9]], id="a gap in Kafka's offsets stays in the run"),
    pytest.param([("s:0", 4), ("c:0", 2), ("s:0", 5)], [["s:0", 4, 4], ["c:0", 2, 2], ["s:0", 5, 5]],
                 id="interleaved positions keep the order they were applied in"),
])
def test_a_record_holds_the_batch_as_runs_in_the_order_applied(applied, runs):
    record = journal_record("b1", [message(p, o) for p, o in applied])
    assert record == {"id": "b1", "read": runs}
    assert record_runs(json.loads(json.dumps(record))) == [tuple(run) for run in runs]


@pytest.mark.parametrize("record", [
    pytest.param(None, id="not JSON"),
    pytest.param([1, 2], id="not an object"),
    pytest.param({"read": [["s:0", 1, 2]]}, id="no batch id"),
    pytest.param({"id": "b", "read": "s:0"}, id="runs not a list"),
    pytest.param({"id": "b", "read": [["s:0", 2, 1]]}, id="a run that ends before it starts"),
    pytest.param({"id": "b", "read": [["s:0", -1, 1]]}, id="a negative offset"),
    pytest.param({"id": "b", "read": [["s:0", 1.0, 2]]}, id="an offset that is not an integer"),
    pytest.param({"id": "b", "read": [["s:0", True, 2]]}, id="an offset that is a boolean"),
])
def test_what_is_not_a_journal_record_is_left_out(record):
    assert record_runs(record) is None


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=20)


@given(record=JSON | st.fixed_dictionaries({"id": st.text(max_size=4), "read": JSON}))
def test_no_record_read_from_the_journal_raises(record):
    runs = record_runs(record)
    assert runs is None or all(isinstance(p, str) and 0 <= a <= b for p, a, b in runs)


def test_a_batch_in_the_journal_twice_counts_once_its_first_copy():
    async def read():
        async def records():
            for offset, record in enumerate([{"id": "b1", "read": [["s:0", 0, 1]]}, "noise", {"id": "b2", "read": []},
                                             {"id": "b1", "read": [["s:0", 7, 8]]}]):
                yield "j:0", offset, record
        return [(record["id"], runs, position, offset)
                async for record, runs, position, offset in unique_records(records())]

    assert asyncio.run(read()) == [("b1", [("s:0", 0, 1)], "j:0", 0), ("b2", [], "j:0", 2)]


def test_input_read_again_is_taken_by_runs_with_what_no_record_holds_before_them_and_the_rest_in_order():
    ranges = {"s:0": (2, 8), "c:0": (0, 3)}

    async def chunks():  # as Kafka gives them: a few of a position at a time
        yield "s:0", [message("s:0", o) for o in (2, 3, 4)], False
        yield "c:0", [message("c:0", o) for o in (0, 1, 2)], True
        yield "s:0", [message("s:0", o) for o in (5, 6, 7)], True

    async def scenario():
        held = RangeBuffer(chunks(), ranges)
        # s:0 2 is in no record (older than the journal's retention): it comes with the first run.
        first = await held.take([("s:0", 3, 4), ("c:0", 0, 0), ("x:0", 0, 5)])
        old = await held.take([("s:0", 0, 1)])  # (before the range: the store has it)
        rest = [(p, [m.offset for m in ms], done) async for p, ms, done in held.rest()]
        return first, old, rest, held.read

    first, old, rest, read = asyncio.run(scenario())
    assert [(m.position, m.offset) for m in first] == [("s:0", 2), ("s:0", 3), ("s:0", 4), ("c:0", 0)]
    assert old == []
    assert {p: offsets for p, offsets, _ in rest if offsets} == {"s:0": [5, 6, 7], "c:0": [1, 2]}
    assert {p for p, _, done in rest if done} == {"s:0", "c:0"}
    assert read == 9
