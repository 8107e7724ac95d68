"""The weight ring's refill in bodies with runs of equal layers, simulated
in Python: every consumed tile starts exactly the tile R places ahead, of
the right (segment, run-layer, tile), whether that crosses a run-layer, a
run, a repetition, the stack's end, the LM head or the step's end."""

import pytest

from megakernel.backends.pallas_tpu.kernels import ring
from megakernel.backends.pallas_tpu.kernels import ring_runs


class _When:
    """``pl.when`` on concrete conditions: run the branch when true."""

    @staticmethod
    def when(cond):
        return lambda fn: fn() if bool(cond) else None


class _Started:
    def __init__(self, log, entry):
        self.log, self.entry = log, entry

    def start(self):
        self.log.append(self.entry)


def _stream(segments, banks, steps):
    stream = ring.Stream(None, None, banks, segments, refs=(), steps=steps)
    stream.log = []
    stream._copy = lambda s, k, j, flat: _Started(stream.log, (s, k, j, flat))
    return stream


def _order(seg):
    """(run-layer, tile) of a layered segment's tiles, in stream order."""
    runs = seg.runs or ((0, len(seg.tiles), 1),)
    for rep in range(seg.count):
        for t0, n, c in runs:
            for r in range(c):
                for j in range(t0, t0 + n):
                    yield rep * c + r, j


def _tiles(n):
    return tuple(ring.Tile(0, 16 * i, 16, 0, 128) for i in range(n))


CASES = [   # (segments' (count, runs), head tiles, banks, steps)
    ([(16, ((0, 3, 3), (3, 2, 1)))], 4, 2, 1),            # R below a run-layer
    ([(2, ((0, 3, 3), (3, 2, 1)))], 4, 7, 1),             # R past a run-layer and a run
    ([(2, ((0, 2, 3), (2, 1, 1)))], 3, 11, 1),            # R past a whole repetition
    ([(3, ((0, 1, 2), (1, 2, 1), (3, 1, 3)))], 2, 5, 2),  # three runs, two steps
    ([(1, ()), (2, ((0, 2, 4), (2, 3, 1)))], 2, 9, 3),    # after a uniform stack
    ([(2, ((0, 2, 3), (2, 1, 1))), (3, ())], 2, 13, 2),   # before one; R past the stack
]


@pytest.mark.parametrize("specs, head, banks, steps", CASES)
def test_every_refill_starts_the_tile_R_places_ahead(monkeypatch, specs, head, banks, steps):
    monkeypatch.setattr(ring_runs, "pl", _When)
    monkeypatch.setattr(ring, "pl", _When)
    segments, offset = [], 0
    for count, runs in specs:
        n = sum(r[1] for r in runs) if runs else 3
        seg = ring.Segment(offset, count, _tiles(n), runs=runs)
        segments.append(seg)
        offset = seg.end
    segments.append(ring.Segment(offset, 1, _tiles(head), layered=False))
    stream = _stream(tuple(segments), banks, steps)
    total = stream.total()
    where = {}                                  # flat -> (segment, run-layer, tile)
    for s, seg in enumerate(segments[:-1]):
        for k, j in _order(seg):
            where[stream.flat(s, k, j)] = (s, k, j)
    for j in range(head):
        where[offset + j] = (len(segments) - 1, 0, j)
    assert sorted(where) == list(range(total))  # the stream is every flat index once
    for step in range(steps):
        stream.step, stream.log[:] = step, []
        for s, seg in enumerate(segments[:-1]):
            for k, j in _order(seg):
                stream._refill(s, k, j)
        for j in range(head):
            stream._refill(len(segments) - 1, 0, j)
        last = step + 1 == steps
        want = [t + banks for t in range(total) if t + banks < total or not last]
        assert sorted(e[3] for e in stream.log) == want
        for s, k, j, flat in stream.log:       # each start fetches that flat's tile
            assert where[flat % total] == (s, k, j), (flat, s, k, j)
