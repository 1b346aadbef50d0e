"""The training stream's arithmetic (train/data/stream.py), which both input pipelines read: each
epoch a permutation of the split keyed by (seed, epoch), and the crops' random numbers keyed by
(seed, position). The pipelines' own tests compare their batches (tests/training/data/test_grain_input.py)."""

import numpy as np
import pytest

from train.data import stream


@pytest.mark.parametrize("size", [1, 2, 3, 5, 16, 17, 1000, 4097])
def test_each_epoch_is_a_permutation_and_the_next_another(size):
    first = stream.records_at(np.arange(size), size, seed=7)
    second = stream.records_at(np.arange(size, 2 * size), size, seed=7)
    assert sorted(first) == sorted(second) == list(range(size))
    if size > 3:
        assert first.tolist() != second.tolist()
        assert first.tolist() != stream.records_at(np.arange(size), size, seed=8).tolist()


def test_a_large_split_is_permuted_without_order_left():
    size = 60_000
    records = stream.records_at(np.arange(size), size, seed=0)
    assert len(np.unique(records)) == size
    assert (records == np.arange(size)).sum() < 10  # about one fixed point expected
    # Neighbouring positions land far apart (a uniform pair is n / 3 apart on average).
    assert abs(np.abs(np.diff(records)).mean() / (size / 3) - 1) < 0.05
    # Each tenth of the positions draws evenly from the tenths of the split.
    counts = np.histogram2d(np.arange(size), records, bins=10)[0]
    assert counts.min() > 0.8 * size / 100 and counts.max() < 1.2 * size / 100


def test_a_position_reads_the_same_record_however_the_positions_are_grouped():
    positions = np.array([5, 123_456, 59_999, 60_000, 7 * 60_000 + 3])
    together = stream.records_at(positions, 60_000, seed=3)
    alone = [stream.records_at([position], 60_000, seed=3)[0] for position in positions]
    assert together.tolist() == alone
    assert stream.records_at(np.array([[1, 2], [3, 4]]), 10, seed=0).shape == (2, 2)


def test_negative_positions_and_empty_splits_are_refused():
    with pytest.raises(ValueError, match="positions are >= 0"):
        stream.records_at([-1], 10, seed=0)
    with pytest.raises(ValueError, match="size 0"):
        stream.records_at([0], 0, seed=0)


def test_crop_draws_are_uniform_and_a_function_of_seed_and_position():
    draws = stream.crop_draws(np.arange(2000), seed=5)
    assert draws.shape == (2000, 4 * stream.CROP_TRIES + 1)
    assert 0.0 <= draws.min() and draws.max() < 1.0 and abs(draws.mean() - 0.5) < 0.01
    np.testing.assert_array_equal(draws[10:12], stream.crop_draws([10, 11], seed=5))
    assert not np.array_equal(draws[:2], stream.crop_draws([0, 1], seed=6))


def test_crops_keep_their_area_and_aspect_ranges():
    boxes = [stream.crop_box(120, 160, draws, 0.1)
             for draws in stream.crop_draws(np.arange(400), seed=0)]
    tops, lefts, heights, widths, flips = map(np.array, zip(*boxes))
    assert (tops >= 0).all() and (tops + heights <= 120).all()
    assert (lefts >= 0).all() and (lefts + widths <= 160).all()
    areas, aspects = heights * widths / (120 * 160), widths / heights
    whole = areas == 1.0
    assert whole.mean() < 0.2  # the fallback to the whole image is rare
    assert areas[~whole].min() >= 0.09 and aspects[~whole].min() >= 0.7
    assert aspects[~whole].max() <= 1.4 and areas.std() > 0.1
    assert 0.4 < flips.mean() < 0.6


def test_tensorflows_crop_box_is_the_same_box():
    tf = pytest.importorskip("tensorflow")
    from train.data import tf_pipeline
    draws = stream.crop_draws(np.arange(300), seed=1)
    for index, (height, width, min_area) in enumerate(
            [(28, 28, 0.05), (120, 160, 0.1), (7, 300, 0.5), (224, 224, 1.0), (1, 1, 0.08)]):
        for row in draws[index * 60:(index + 1) * 60]:
            got = tf_pipeline.crop_box(tf.constant([height, width, 3]), tf.constant(row),
                                       min_area)
            assert [int(value) for value in got[:4]] + [bool(got[4])] == list(
                stream.crop_box(height, width, row, min_area))
