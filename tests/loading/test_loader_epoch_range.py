"""An epoch is counted in 64 bits: a mixed sample's position is epoch x samples per epoch + i, in int64. A saved
state or `set_epoch` beyond the last epoch that can be counted is one `ConfigError` line naming the epoch and
the limit (a mixing state with epoch 2^62 was an OverflowError traceback); every epoch up to it is served.
"""

import pytest

from support.data import write_random_dataset
from dataflow import ConfigError, StreamingDataLoader, StreamingDataset



@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    root = tmp_path_factory.mktemp("epochs")
    return {write_random_dataset(root / "a", 40, seed=1, min_len=50): 0.7,
            write_random_dataset(root / "b", 40, seed=2, min_len=50): 0.3}


def _batch(ds):
    return next(iter(StreamingDataLoader(ds, batch_size=2)))


def _last_epoch(ds):
    """The last epoch whose every position fits in int64."""
    return 2**63 // ds.num_samples - 1


@pytest.mark.parametrize("epoch", [2**62, 2**63 - 1, 2**64, "last+1"])
def test_a_mixing_state_with_an_epoch_past_int64_is_one_config_error(mix, epoch):
    ds = StreamingDataset(mix, seq_len=16)
    epoch = _last_epoch(ds) + 1 if epoch == "last+1" else epoch
    state = ds.state_dict()
    state["epoch"] = epoch
    loader = StreamingDataLoader(ds, batch_size=2)
    with pytest.raises(ConfigError) as e:
        loader.load_state_dict(state)
    msg = str(e.value)
    assert str(epoch) in msg and f"{_last_epoch(ds):,}" in msg and "\n" not in msg
    assert ds.epoch == 0  # nothing moved


def test_set_epoch_past_the_last_countable_epoch_is_refused_for_any_dataset(mix):
    for source in (mix, next(iter(mix))):  # a mix, and one dataset alone
        ds = StreamingDataset(source, seq_len=16)
        with pytest.raises(ConfigError, match=r"set_epoch.*at most"):
            ds.set_epoch(2**62)


def test_the_last_countable_epoch_is_served_and_the_one_after_it_refused_in_one_line(mix):
    ds = StreamingDataset(mix, seq_len=16)
    last = _last_epoch(ds)
    state = ds.state_dict()
    state["epoch"], state["consumed"] = last, ds.num_samples - 2  # one batch of 2 left in that epoch
    ds.load_state_dict(state)
    batches = list(StreamingDataLoader(ds, batch_size=2))
    assert len(batches) == 1 and batches[0]["input_ids"].shape == (2, 16)
    assert ds.epoch == last + 1  # the epoch turned, as after any epoch
    with pytest.raises(ConfigError, match=f"epoch {last + 1}"):
        _batch(ds)
