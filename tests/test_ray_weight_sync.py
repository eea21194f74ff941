"""The collective weight sync on a real local Ray cluster: a worker killed mid-broadcast (CPU, gloo),
and the colocated CUDA IPC path on one GPU (``-m gpu``).

The learner is the tiny random-init Llama of ``test_ray_learner``; the workers run the scripted engine
with ``keep_weights`` (it keeps a copy of what it was sent, so a test reads the engine's weights).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_ray_learner import tiny_config

ray = pytest.importorskip("ray")

TIMEOUT_S = 4.0


@pytest.fixture(scope="module")
def cluster():
    from chatgym.trainer.distributed.cluster import start_or_join

    address = os.environ.pop("RAY_ADDRESS", None)  # this module's cluster is its own
    try:
        c = start_or_join(None, num_cpus=4)
    finally:
        if address is not None:
            os.environ["RAY_ADDRESS"] = address
    seen = set(c.pids())
    yield c
    seen |= c.pids()
    c.shutdown()
    time.sleep(0.5)
    left = [p for p in seen if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert left == [], f"Ray processes left: {left}"


def _scale_weights(group, factor: float) -> None:
    """Change the learner's weights (a stand-in for an update): every parameter times ``factor``."""

    def scale(actor):
        with torch.no_grad():
            for p in actor.learner.policy.parameters():
                p.mul_(factor)

    ray.get(group.actors[0].__ray_call__.remote(scale))


def _want(group) -> int:
    from chatgym.trainer.distributed.weights import checksum

    return checksum(sorted(((n, t.to(torch.bfloat16)) for n, t in group.state_dict().items()), key=lambda p: p[0]))


def test_a_worker_killed_mid_broadcast_costs_at_most_the_timeout(cluster, tmp_path):
    """Two workers over a gloo group with learner rank 0, buckets of 4 KiB. Worker 1 is told (test
    hook) to wait 3 s before joining the next broadcast and is killed -9 after 1 s of it: the sync
    returns within weight_sync_timeout_s (+ slack), worker 0 has the new version and the new weights
    (by the broadcast or, if that failed, the object store), worker 1 restarts and gets them, and the
    next sync is a broadcast to both again (the group formed anew)."""
    from chatgym.trainer.distributed.learner import RayLearnerGroup
    from chatgym.trainer.distributed.ray_rollout import RayRollout
    from chatgym.trainer.models.packaged import load_model_path

    cfg = tiny_config(
        tmp_path,
        "trainer.backend=ray",
        "trainer.ray.num_rollout_workers=2",
        "trainer.ray.worker_num_cpus=0.5",
        "trainer.ray.engine_factory=chatgym.testing:scripted_engine",
        "engine.options={keep_weights: true}",
        "trainer.ray.weight_sync=collective",
        f"trainer.ray.weight_sync_timeout_s={TIMEOUT_S}",
        "trainer.ray.weight_bucket_bytes=1048576",  # the smallest allowed: the tiny model is ~6 MiB
    )
    group = RayLearnerGroup(cfg, out_dir=tmp_path)
    rollout = RayRollout(cfg, model_path=str(load_model_path("smollm2")), out_dir=str(tmp_path))
    try:
        sync = group.collective
        sync.verify = True
        rollout.set_weights(group.export_weights(torch.bfloat16), 1)
        want1 = _want(group)
        assert sorted(sync.stats) == [0, 1] and all(s["checksum"] == want1 for s in sync.stats.values())
        assert ray.get([w.engine_checksum.remote() for w in rollout.workers]) == [want1, want1]
        assert sync.forms == 1 and sync.metrics["sync/bytes"] > 1048576 * 2  # several buckets

        _scale_weights(group, 1.5)
        want2 = _want(group)
        assert want2 != want1
        victim = rollout.infos[1]["pid"]
        ray.get(rollout.workers[1].hold_receive_for_test.remote(3.0))
        threading.Timer(1.0, os.kill, (victim, signal.SIGKILL)).start()
        t0 = time.perf_counter()
        rollout.set_weights(group.export_weights(torch.bfloat16), 2)
        took = time.perf_counter() - t0
        assert took < TIMEOUT_S + 20.0, took  # not the group's 10 minutes
        assert sync.lost == {1} and 1 in rollout._down
        info0 = ray.get(rollout.workers[0].info.remote())
        assert info0["weight_version"] == 2
        assert ray.get(rollout.workers[0].engine_checksum.remote()) == want2

        # Worker 1 comes back (a new process) with version 2 from the object store.
        assert rollout.wait_for_workers(timeout_s=120)
        info1 = ray.get(rollout.workers[1].info.remote())
        assert info1["pid"] != victim and info1["weight_version"] == 2
        assert ray.get(rollout.workers[1].engine_checksum.remote()) == want2

        # The next sync forms the group again and broadcasts to both.
        _scale_weights(group, 0.5)
        want3 = _want(group)
        rollout.set_weights(group.export_weights(torch.bfloat16), 3)
        assert sync.forms == 2 and sync.lost == set()
        assert sorted(sync.stats) == [0, 1]
        for s in sync.stats.values():
            assert s["ok"] and not s.get("fallback") and s["checksum"] == want3
        assert sync.metrics["sync/fallback_workers"] == 0.0
        assert [i["weight_version"] for i in ray.get([w.info.remote() for w in rollout.workers])] == [3, 3]
    finally:
        rollout.close()
        group.close()


def test_a_role_asking_for_more_gpus_than_the_cluster_fails_at_once(cluster, tmp_path):
    """A learner or worker asking for more GPUs than the cluster has would wait forever: it fails
    at once, naming the fields and the counts."""
    from chatgym.trainer.distributed.learner import RayLearnerGroup
    from chatgym.trainer.distributed.ray_rollout import RayRollout

    gpus = int(ray.cluster_resources().get("GPU", 0))
    cfg = tiny_config(tmp_path, "trainer.backend=ray", "trainer.ray.num_learners=2", f"trainer.ray.learner_num_gpus={gpus + 1}")
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as info:
        RayLearnerGroup(cfg, out_dir=tmp_path)
    assert str(info.value) == (
        f"trainer.ray.num_learners x learner_num_gpus asks for {2 * (gpus + 1)} GPU(s) but the Ray cluster has "
        f"{gpus} (ray.cluster_resources()); lower them or start the cluster with more"
    )
    cfg = tiny_config(tmp_path, "trainer.backend=ray", "trainer.ray.num_rollout_workers=3", "trainer.ray.worker_num_cpus=2")
    with pytest.raises(ValueError, match=r"^trainer.ray.num_rollout_workers x worker_num_cpus asks for 6 CPU\(s\) but the Ray cluster has 4 "):
        RayRollout(cfg, model_path="unused", out_dir=str(tmp_path))
    cfg = tiny_config(tmp_path, "trainer.backend=ray", "model.device=cuda")
    with pytest.raises(ValueError, match=r"^model.device is cuda but trainer.ray.learner_num_gpus is 0"):
        RayLearnerGroup(cfg, out_dir=tmp_path)
    assert time.perf_counter() - t0 < 10  # no actor was made, nothing waited


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_colocated_learner_and_worker_share_weights_by_cuda_ipc(cluster, tmp_path):
    """One GPU, the tiny run with trainer.backend ray: learner + worker colocated at 0.5 GPU each,
    weight_sync collective. The worker maps learner rank 0's buffer once (CUDA IPC); after each train
    step its hf engine holds exactly the learner's bf16 weights and the new version; the second step
    reuses the mapping; the step's metrics carry timing/sync_s and the sync/* breakdown."""
    from chatgym.trainer.train import Trainer

    if ray.cluster_resources().get("GPU", 0) < 1:
        pytest.fail(f"the Ray cluster sees no GPU: {ray.cluster_resources()}")
    cfg = tiny_config(
        tmp_path,
        "model.device=cuda",
        "engine.dtype=bfloat16",
        "trainer.backend=ray",
        "trainer.ray.placement=colocated",
        "trainer.ray.learner_num_gpus=0.5",
        "trainer.ray.worker_num_gpus=0.5",
        "trainer.ray.worker_num_cpus=0.5",
        "trainer.ray.weight_sync=collective",
        # A packaged env: the tiny config's test env is registered in this process only, so every
        # worker episode of it failed (env_error: NameNotFound) and no update ran (H200, first run).
        "env.id=Math-v0",
        "rollout.max_model_len=512",
    )
    trainer = Trainer(cfg)
    try:
        group, worker = trainer.learner, trainer.rollout.workers[0]
        sync = group.collective
        assert sync.ipc == {0}  # the worker is on the learner's GPU
        sync.verify = True
        rows = []
        for step in range(2):
            rows.append(trainer.step(step))
            batch = {k: v for k, v in rows[-1].items() if k.startswith(("batch/", "reward/", "rollout/error"))}
            assert group.version == step + 1, batch
            want = _want(group)
            assert sync.stats[0]["ok"] and sync.stats[0]["checksum"] == want
            assert ray.get(worker.engine_checksum.remote()) == want  # the engine's own parameters
            assert ray.get(worker.info.remote())["weight_version"] == step + 1
        assert sync.stats[0]["made"] is False  # step 2 reused step 1's mapping
        for row in rows:
            assert row["timing/sync_s"] > 0 and row["sync/bytes"] > 0 and "sync/stage_s" in row
        print("sync metrics of step 2 (with verify):", {k: v for k, v in rows[1].items() if "sync" in k})
    finally:
        trainer.close()


def test_a_step_whose_every_episode_failed_says_so(cluster, tmp_path, capfd):
    """The tiny config's env is registered in this process only: on Ray every worker episode fails
    (env_error: NameNotFound), nothing is trained, and the step says so in one line instead of ending
    as if it had trained (how the colocated GPU test first failed on the H200)."""
    from chatgym.trainer.train import Trainer

    cfg = tiny_config(tmp_path, "trainer.backend=ray", "trainer.ray.worker_num_cpus=0.5")
    trainer = Trainer(cfg)
    try:
        metrics = trainer.step(0)
    finally:
        trainer.close()
    assert trainer.learner.version == 0
    assert metrics["batch/failed"] == metrics["batch/trajectories"] == 8
    err = capfd.readouterr().err
    line = next(x for x in err.splitlines() if "episodes failed" in x)
    assert line.startswith("chatgym: step 1: all 8 episodes failed, nothing was trained (8 of them: env_error: ")
    assert "NameNotFound" in line and "ChatgymTestLetters" in line


def test_chatgym_train_refuses_gpus_the_cluster_lacks_in_one_line(cluster, tmp_path, capsys):
    # Found by a fresh-user check: the resource check's error reached the user as a traceback (rc 1),
    # and the workers' request was checked only after the learner had loaded its weights.
    from chatgym.trainer.train_cli import main

    out = tmp_path / "run"
    args = ["trainer.backend=ray", "trainer.ray.worker_num_gpus=1", "env.eval_tasks=0", "--output-dir", str(out)]
    assert main(["examples/configs/math_grpo.yaml", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "chatgym train: trainer.ray.num_rollout_workers x worker_num_gpus asks for 1 GPU(s) but the Ray "
        "cluster has 0 (ray.cluster_resources()); lower them or start the cluster with more"
    )
    assert not out.exists()


def test_a_missing_package_at_start_up_is_one_line():
    from chatgym.trainer.train_cli import startup_refusal

    exc = ModuleNotFoundError("VLLMEngine needs vLLM: pip install 'chatgym[vllm]'")
    assert startup_refusal(exc) == (
        "VLLMEngine needs vLLM: pip install 'chatgym[vllm]' (a missing package: see docs/training.md#set-up)"
    )
    assert startup_refusal(RuntimeError("a bug")) is None
