"""The replay buffer: bounds, order, staleness, per-token versions, checkpoints, spill to disk."""

from __future__ import annotations

import pickle

import pytest

from chatgym.trainer.replay_buffer import GroupEntry, ReplayBuffer, entries_from_trajectories
from chatgym.trainer.rollout.types import Trajectory


def traj(group: int, sample: int, reward: float, versions: list[int], error: str | None = None) -> Trajectory:
    """A trajectory of 2 prompt tokens then one generated token per entry of ``versions``."""
    n = len(versions)
    return Trajectory(
        env_id="X-v0",
        task_id=group,
        group_id=group,
        sample_index=sample,
        token_ids=[1, 2, *range(10, 10 + n)],
        loss_mask=[0, 0, *[1] * n],
        engine_logprobs=[0.0, 0.0, *[-0.5] * n],
        weight_versions=[-1, -1, *versions],
        reward=reward,
        error=error,
        info={"note": ("a", 1)},
    )


def group(step: int, g: int, rewards=(1.0, 0.0), versions=(3, 4), issued: int = 3) -> GroupEntry:
    return GroupEntry(step, g, [traj(g, i, r, list(versions)) for i, r in enumerate(rewards)], issued)


def test_entry_versions_and_variance_from_tokens():
    e = GroupEntry(
        0, 1, [traj(1, 0, 1.0, [2, 3]), traj(1, 1, 0.0, [3, 5]), traj(1, 2, 9.0, [], error="boom")], 2
    )
    # Prompt tokens (-1) are not versions; the failed sample's reward is not in the variance.
    assert (e.min_version, e.max_version) == (2, 5)
    assert e.reward_variance == 0.25  # var([1, 0]) = 0.25 (population)
    assert e.staleness(7) == 5
    # A group that generated nothing has the version its request was issued at.
    empty = GroupEntry(0, 2, [traj(2, 0, 0.0, [])], issued_version=6)
    assert (empty.min_version, empty.max_version, empty.reward_variance) == (6, 6, 0.0)


def test_fifo_order_and_capacity_evicts_oldest():
    buf = ReplayBuffer(capacity=3)
    for g in range(3):
        assert buf.put(group(0, g)) == []
    evicted = buf.put(group(1, 0))
    assert [e.key for e in evicted] == [(0, 0)]
    assert buf.evicted == 1
    assert buf.keys() == [(0, 1), (0, 2), (1, 0)]
    got = buf.take(2)
    assert [e.key for e in got] == [(0, 1), (0, 2)]
    assert got[0].trajectories[1].reward == 0.0
    assert buf.keys() == [(1, 0)]
    assert buf.take(5)[0].key == (1, 0) and len(buf) == 0


def test_same_group_twice_is_refused():
    buf = ReplayBuffer(capacity=4)
    buf.put(group(0, 0))
    with pytest.raises(ValueError, match=r"\(0, 0\) is already"):
        buf.put(group(0, 0))


def test_reward_variance_priority_puts_informative_groups_first():
    buf = ReplayBuffer(capacity=3, priority="reward_variance")
    buf.put(group(0, 0, rewards=(1.0, 1.0)))  # uniform: no GRPO signal
    buf.put(group(0, 1, rewards=(1.0, 0.0)))
    buf.put(group(0, 2, rewards=(0.0, 0.0)))
    assert buf.keys() == [(0, 1), (0, 0), (0, 2)]
    # Over capacity, the priority evicts what it would take last: the newest uniform group.
    evicted = buf.put(group(0, 3, rewards=(0.0, 1.0)))
    assert [e.key for e in evicted] == [(0, 2)]
    assert buf.keys() == [(0, 1), (0, 3), (0, 0)]


def test_unknown_priority_and_bad_capacity_are_named():
    with pytest.raises(ValueError, match="known: fifo, reward_variance"):
        ReplayBuffer(4, priority="newest")
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        ReplayBuffer(0)


def test_drop_stale_removes_only_groups_past_the_bound():
    buf = ReplayBuffer(capacity=8)
    buf.put(group(0, 0, versions=(1, 4)))  # oldest token v1
    buf.put(group(0, 1, versions=(3, 3)))
    buf.put(group(1, 0, versions=(4, 5)))
    assert buf.staleness(5) == [4, 2, 1]
    dropped = buf.drop_stale(version=5, max_staleness=2)
    assert [e.key for e in dropped] == [(0, 0)]
    assert buf.keys() == [(0, 1), (1, 0)] and buf.dropped_stale == 1


def test_state_dict_round_trip_gives_the_same_next_batch():
    buf = ReplayBuffer(capacity=5, priority="reward_variance")
    for g, rewards in enumerate([(1.0, 1.0), (0.0, 1.0), (1.0, 0.0), (0.0, 0.0)]):
        buf.put(group(2, g, rewards=rewards, versions=(g, g + 1)))
    buf.take(1)
    state = pickle.loads(pickle.dumps(buf.state_dict()))  # what the checkpoint stores
    fresh = ReplayBuffer(capacity=5, priority="reward_variance")
    fresh.load_state_dict(state)
    a, b = buf.take(2), fresh.take(2)
    # Order: informative 1 (taken above), 2; then uniform 0, 3.
    assert [e.key for e in a] == [e.key for e in b] == [(2, 2), (2, 0)]
    for ea, eb in zip(a, b, strict=True):
        assert [t.to_json() for t in ea.trajectories] == [t.to_json() for t in eb.trajectories]
        assert (ea.seq, ea.min_version, ea.max_version) == (eb.seq, eb.min_version, eb.max_version)
    # Arrival numbers continue where the saved buffer stopped.
    buf.put(group(3, 0))
    fresh.put(group(3, 0))
    assert buf.keys() == fresh.keys()


def test_spill_to_disk_keeps_trajectories_off_memory_and_reopens(tmp_path):
    buf = ReplayBuffer(capacity=4, spill_dir=tmp_path)
    original = group(0, 1, versions=(7, 8))
    expected = [t.to_json() for t in original.trajectories]
    buf.put(original)
    buf.put(group(0, 2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000000_000001.json", "00000000_000002.json"]
    assert all(e.trajectories is None for e in buf._entries.values())
    # Another process re-opens the same directory and takes the same groups, versions included.
    reopened = ReplayBuffer.open_spilled(tmp_path, capacity=4)
    assert reopened.keys() == [(0, 1), (0, 2)]
    got = reopened.take(1)[0]
    # Tuples come back as JSON lists; everything else as it was.
    expected[0]["info"]["note"] = ["a", 1]
    expected[1]["info"]["note"] = ["a", 1]
    assert [t.to_json() for t in got.trajectories] == expected
    assert got.trajectories[0].weight_versions == [-1, -1, 7, 8]
    assert not (tmp_path / "00000000_000001.json").exists()


def test_entries_from_trajectories_split_by_group_in_sample_order():
    trajs = [traj(0, 1, 0.0, [1]), traj(0, 0, 1.0, [1]), traj(2, 0, 1.0, [2])]
    entries = entries_from_trajectories(trajs, step=4, issued_version=1)
    assert [e.key for e in entries] == [(4, 0), (4, 2)]
    assert [t.sample_index for t in entries[0].trajectories] == [0, 1]


def _image_group(step: int, g: int):
    from PIL import Image

    from chatgym.trainer.chat.images import image_sha256

    red = Image.new("RGB", (4, 3), (255, 0, 0))
    noise = Image.frombytes("RGB", (5, 2), bytes(range(30)))
    entry = group(step, g)
    for t in entry.trajectories:
        t.image_store = {image_sha256(red): red, image_sha256(noise): noise}
        t.images = [image_sha256(red), image_sha256(noise), image_sha256(red)]
    return entry, [red, noise, red]


def test_spilled_and_checkpointed_groups_keep_their_images(tmp_path):
    # A spilled group and a checkpointed buffer come back with the pixels, not only the refs.
    buf = ReplayBuffer(capacity=4, spill_dir=tmp_path)
    entry, images = _image_group(0, 1)
    buf.put(entry)
    got = ReplayBuffer.open_spilled(tmp_path, capacity=4).take(1)[0].trajectories[0]
    assert [im.tobytes() for im in got.image_list()] == [im.tobytes() for im in images]
    assert [im.size for im in got.image_list()] == [(4, 3), (5, 2), (4, 3)]
    mem = ReplayBuffer(capacity=4)
    mem.put(_image_group(0, 2)[0])
    fresh = ReplayBuffer(capacity=4)
    fresh.load_state_dict(pickle.loads(pickle.dumps(mem.state_dict())))
    back = fresh.take(1)[0].trajectories[1]
    assert [im.tobytes() for im in back.image_list()] == [im.tobytes() for im in images]
    assert "image_store_png" not in back.to_json()  # traces still hold refs only
