"""The frames between the reader and the capture worker (logcapture/frame.py): what one end
encodes the other decodes, whole or in any pieces; a corrupt or cut-short frame is an error
that says where and what."""

from __future__ import annotations

import os
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from logcapture import frame
from logcapture.frame import END, HEADER, KIND, READ_ENTRY, STREAMS, FrameError
from logcapture.runner.readloop import PASSES, READ_SIZE, READS_IN_A_ROW
from logcapture.runner.worker import COALESCE, PUMP_BYTES, Worker

times = st.floats(allow_nan=False, allow_infinity=False)
payloads = st.one_of(st.binary(max_size=300), st.just(b""),
                     st.integers(0, 1 << 20).map(lambda n: bytes([n % 251]) * n))
reads = st.lists(st.tuples(payloads, times, st.booleans()), min_size=1, max_size=5)
data_frames = st.tuples(st.sampled_from(STREAMS), reads, times, times)

Frame = tuple[str, list[tuple[bytes, float, bool]], float, float]


def _encode(frames: list[Frame]) -> bytes:
    return b"".join(frame.encode_reads(KIND[s], r, first, last) for s, r, first, last in frames)


@given(st.lists(data_frames, max_size=8))
def test_frames_round_trip(frames: list[Frame]) -> None:
    got = frame.decode(_encode(frames))
    assert [(STREAMS[k], r, first, last) for k, r, first, last, _ in got] == frames
    assert [p for *_, p in got] == [b"".join(d for d, _, _ in r) for _, r, _, _ in frames]


@given(st.lists(data_frames, max_size=6), st.lists(st.integers(0, 1 << 21), max_size=6))
def test_split_finds_the_same_frames_whatever_the_reads(
        frames: list[Frame], cuts: list[int]) -> None:
    # The worker reads the pipe in whatever pieces it gets and splits what it has so far.
    data = _encode(frames)
    buf = bytearray()
    found = []
    at = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        buf += data[at:max(at, cut)]
        at = max(at, cut)
        got, pos = frame.split(buf)
        for kind, lengths, walls, ends, first, last, start, end in got:
            payload = bytes(buf[start:end])
            offsets = [sum(lengths[:i]) for i in range(len(lengths) + 1)]
            found.append((STREAMS[kind],
                          [(payload[a:b], wall, bool(e))
                           for a, b, wall, e in zip(offsets, offsets[1:], walls, ends,
                                                    strict=False)],
                          first, last))
        del buf[:pos]
    assert found == frames and not buf


@given(st.dictionaries(st.text(max_size=10), st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 60), 1 << 60), st.text(max_size=20),
    st.dictionaries(st.text(max_size=5), st.integers(0, 1 << 40), max_size=3))))
def test_the_end_frame_carries_the_outcome(outcome: dict[str, object]) -> None:
    data = frame.encode(END, frame.encode_end(outcome), 1.5, 2.5)
    [(kind, got_reads, first, last, payload)] = frame.decode(data)
    assert (kind, got_reads, first, last) == (END, [], 2.5, 2.5)
    assert frame.decode_end(payload) == outcome


def test_an_empty_read_and_a_round_end() -> None:
    data = frame.encode(KIND["stderr"], b"", 3.0, 4.0, round_end=True)
    assert len(data) == HEADER.size + READ_ENTRY
    assert frame.decode(data) == [(1, [(b"", 3.0, True)], 4.0, 4.0, b"")]


def test_split_waits_for_a_frame_being_written() -> None:
    data = frame.encode_reads(0, [(b"hello", 1.0, False), (b"there", 1.5, True)], 2.0, 2.5)
    for n in range(len(data)):
        assert frame.split(data[:n]) == ([], 0)


@pytest.mark.parametrize("cut", [1, HEADER.size - 1, HEADER.size, HEADER.size + 3,
                                 HEADER.size + READ_ENTRY + 2])
def test_a_frame_cut_short_is_an_error_naming_where(cut: int) -> None:
    whole = frame.encode(0, b"first", 1.0, 2.0)
    data = whole + frame.encode(1, b"second", 1.0, 2.0)[:cut]
    with pytest.raises(FrameError, match=rf"frame at byte {len(whole)} is cut short"):
        frame.decode(data)


@pytest.mark.parametrize("kind", [3, 0x7F, 0x80, 0xFF])
def test_an_unknown_kind_is_an_error_naming_it(kind: int) -> None:
    first = frame.encode(0, b"ok", 1.0, 2.0)
    data = first + HEADER.pack(kind, 0, 1, 1.0, 2.0)
    with pytest.raises(FrameError, match=rf"frame at byte {len(first)}: unknown kind "
                                         rf"0x{kind:02x}"):
        frame.split(data)


@pytest.mark.parametrize("header, what", [
    (HEADER.pack(0, frame.MAX_PAYLOAD + 1, 1, 1.0, 2.0), "a payload length of"),
    (HEADER.pack(0, 0, frame.MAX_READS + 1, 1.0, 2.0),
     f"{frame.MAX_READS + 1} reads are over the limit"),
    (HEADER.pack(0, 0, 0, 1.0, 2.0), "a frame of output with no read"),
    (HEADER.pack(END, 0, 1, 1.0, 2.0), "an end frame carries no reads, this one 1"),
], ids=["length", "reads", "no read", "end"])
def test_a_header_no_reader_writes_is_an_error_not_a_wait(header: bytes, what: str) -> None:
    with pytest.raises(FrameError, match=f"frame at byte 0: {what}"):
        frame.split(header)


def test_a_table_that_does_not_add_up_is_an_error() -> None:
    data = bytearray(frame.encode_reads(0, [(b"ab", 1.0, False), (b"cd", 2.0, True)], 1, 2))
    data[1:5] = (3).to_bytes(4, sys.byteorder)
    with pytest.raises(FrameError, match="add up to 4 bytes, not its payload's 3"):
        frame.split(bytes(data[:-1]))


def test_a_payload_over_the_limit_is_not_encoded() -> None:
    with pytest.raises(FrameError, match="over the limit"):
        frame.encode(0, bytes(frame.MAX_PAYLOAD + 1), 1.0, 2.0)


@pytest.mark.parametrize("payload, what", [(b"{", "not JSON"), (b"\xff", "not JSON"),
                                           (b"[1]", "a JSON list, not an object")])
def test_an_end_frame_that_is_no_outcome_is_an_error(payload: bytes, what: str) -> None:
    with pytest.raises(FrameError, match=what):
        frame.decode_end(payload)


def test_no_frame_of_the_reader_exceeds_the_payload_bound() -> None:
    # A frame is closed at a pump, and a pump is due once PUMP_BYTES wait: at most that
    # plus one round.
    assert PUMP_BYTES + PASSES * READS_IN_A_ROW * READ_SIZE \
        <= frame.MAX_PAYLOAD


def test_the_reader_joins_one_streams_rounds_and_keeps_each_rounds_time() -> None:
    # The reader's side of the pipe: rounds of one stream within COALESCE join one frame,
    # each with its time and round end; another stream, or a later round, starts a frame.
    r, w = os.pipe()
    worker = Worker(0, w)
    t = time.time()
    worker.send(KIND["stdout"], [b"a\n", b"b\n"], t, 1.0)
    worker.end_round()
    worker.send(KIND["stdout"], [b"c\n"], t + COALESCE / 2, 1.001)
    worker.send(KIND["stderr"], [b"E\n"], t + COALESCE / 2, 1.001)
    worker.end_round()
    worker.send(KIND["stderr"], [b"F\n"], t + 2 * COALESCE, 1.02)
    worker.end_round()
    worker.pump()
    assert worker.size == 0
    got = frame.decode(os.read(r, 1 << 16))
    os.close(r)
    os.close(w)
    assert got == [
        (0, [(b"a\nb\n", t, True), (b"c\n", t + COALESCE / 2, False)], 1.0, 1.001,
         b"a\nb\nc\n"),
        (1, [(b"E\n", t + COALESCE / 2, True)], 1.001, 1.001, b"E\n"),
        (1, [(b"F\n", t + 2 * COALESCE, True)], 1.02, 1.02, b"F\n"),
    ]
