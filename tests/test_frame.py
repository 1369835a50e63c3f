"""The frames between the reader and the capture worker (logcapture/frame.py): what one end
encodes the other decodes, whole or in any pieces; a corrupt or cut-short frame is an error
that says where and what."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from logcapture import frame
from logcapture.frame import END, HEADER, KIND, ROUND_END, STREAMS, FrameError

times = st.floats(allow_nan=False, allow_infinity=False)
payloads = st.one_of(st.binary(max_size=300), st.just(b""),
                     st.integers(0, 1 << 20).map(lambda n: bytes([n % 251]) * n))
data_frames = st.tuples(st.sampled_from(STREAMS), st.booleans(), times, times, payloads)


def _encode(frames: list[tuple[str, bool, float, float, bytes]]) -> bytes:
    return b"".join(frame.encode(KIND[s] | (ROUND_END if r else 0), p, wall, mono)
                    for s, r, wall, mono, p in frames)


@given(st.lists(data_frames, max_size=8))
def test_frames_round_trip(frames: list[tuple[str, bool, float, float, bytes]]) -> None:
    got = frame.decode(_encode(frames))
    assert [(STREAMS[k], r, wall, mono, p) for k, r, wall, mono, p in got] == frames


@given(st.lists(data_frames, max_size=6), st.lists(st.integers(0, 1 << 21), max_size=6))
def test_split_finds_the_same_frames_whatever_the_reads(
        frames: list[tuple[str, bool, float, float, bytes]], cuts: list[int]) -> None:
    # The worker reads the pipe in whatever pieces it gets and splits what it has so far.
    data = _encode(frames)
    buf = bytearray()
    found = []
    at = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        buf += data[at:max(at, cut)]
        at = max(at, cut)
        got, pos = frame.split(buf)
        found += [(STREAMS[k], r, wall, mono, bytes(buf[start:end]))
                  for k, r, wall, mono, start, end in got]
        del buf[:pos]
    assert found == frames and not buf


@given(st.dictionaries(st.text(max_size=10), st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 60), 1 << 60), st.text(max_size=20),
    st.dictionaries(st.text(max_size=5), st.integers(0, 1 << 40), max_size=3))))
def test_the_end_frame_carries_the_outcome(outcome: dict[str, object]) -> None:
    data = frame.encode(END, frame.encode_end(outcome), 1.5, 2.5)
    [(kind, round_end, wall, mono, payload)] = frame.decode(data)
    assert (kind, round_end, wall, mono) == (END, False, 1.5, 2.5)
    assert frame.decode_end(payload) == outcome


def test_an_empty_frame_and_a_round_end() -> None:
    data = frame.encode(KIND["stderr"] | ROUND_END, b"", 3.0, 4.0)
    assert len(data) == HEADER.size
    assert frame.decode(data) == [(1, True, 3.0, 4.0, b"")]


def test_split_waits_for_a_frame_being_written() -> None:
    data = frame.encode(0, b"hello", 1.0, 2.0)
    for n in range(len(data)):
        assert frame.split(data[:n]) == ([], 0)


@pytest.mark.parametrize("cut", [1, HEADER.size - 1, HEADER.size, HEADER.size + 3])
def test_a_frame_cut_short_is_an_error_naming_where(cut: int) -> None:
    whole = frame.encode(0, b"first", 1.0, 2.0)
    data = whole + frame.encode(1, b"second", 1.0, 2.0)[:cut]
    with pytest.raises(FrameError, match=rf"frame at byte {len(whole)} is cut short"):
        frame.decode(data)


@pytest.mark.parametrize("kind", [3, 0x7F, END | ROUND_END, 0xFF])
def test_an_unknown_kind_is_an_error_naming_it(kind: int) -> None:
    data = frame.encode(0, b"ok", 1.0, 2.0) + HEADER.pack(kind, 0, 1.0, 2.0)
    with pytest.raises(FrameError, match=rf"frame at byte {HEADER.size + 2}: unknown kind "
                                         rf"0x{kind:02x}"):
        frame.split(data)


def test_a_length_no_reader_writes_is_an_error_not_a_wait() -> None:
    data = HEADER.pack(0, frame.MAX_PAYLOAD + 1, 1.0, 2.0)
    with pytest.raises(FrameError, match="frame at byte 0: a payload length of"):
        frame.split(data)
    with pytest.raises(FrameError, match="over the limit"):
        frame.encode(0, bytes(frame.MAX_PAYLOAD + 1), 1.0, 2.0)


@pytest.mark.parametrize("payload, what", [(b"{", "not JSON"), (b"\xff", "not JSON"),
                                           (b"[1]", "a JSON list, not an object")])
def test_an_end_frame_that_is_no_outcome_is_an_error(payload: bytes, what: str) -> None:
    with pytest.raises(FrameError, match=what):
        frame.decode_end(payload)


def test_no_round_of_the_reader_exceeds_the_payload_bound() -> None:
    from logcapture import runner

    assert runner.PASSES * runner.READS_IN_A_ROW * runner.READ_SIZE <= frame.MAX_PAYLOAD
