"""The learner half of training on Ray: data-parallel learner actors on one real local Ray cluster.

One cluster for the module (127.0.0.1, 4 logical CPUs). A local ``Trainer`` on the tiny random-init
Llama of the trainer tests (letters env, reference policy with ``algo.kl_coef``, two PPO epochs of two
mini-batches: old logprobs and a shuffled mini-batch order) collects step 1's trajectories and updates
its own learner on them: the reference result. Learner groups on Ray update on the same trajectories
and must end at the same weights. One test has the disk refuse a learner's checkpoint; the last kills a
learner with SIGKILL between steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from train_helpers import LETTERS_ENV_ID, TINY_LLAMA, register, torch_threads

ray = pytest.importorskip("ray")


def tiny_config(out: Path, *extra: str):
    from chatgym.trainer.config.run import load_config

    register()
    return load_config(
        None,
        [
            "engine.backend=hf",
            "engine.dtype=float32",
            "model.dtype=float32",
            "model.device=cpu",
            "model.compute_dtype=float32",
            "model.random_init=true",
            "model.config_overrides=" + json.dumps(TINY_LLAMA),
            f"env.id={LETTERS_ENV_ID}",
            "env.eval_tasks=0",
            "rollout.max_tokens=8",
            "rollout.max_response_tokens=8",
            "rollout.max_model_len=128",
            "train.max_steps=1",
            "train.prompts_per_step=2",
            "train.group_size=4",
            "train.micro_batch_size=3",
            "train.progress=false",
            "train.tensorboard=false",
            "train.trace_fraction=0.0",
            f"train.output_dir={out}",
            "optim.lr=1e-3",
            "algo.kl_coef=0.01",
            "algo.ppo_epochs=2",
            "algo.mini_batches=2",
            "trainer.ray.learner_num_cpus=0.5",
            *extra,
        ],
    )


# ---- the data-parallel split (no Ray) ----------------------------------------------------------


class _Mini:
    def __init__(self, lengths):
        self.attention_mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
        for i, n in enumerate(lengths):
            self.attention_mask[i, :n] = 1


def test_assign_gives_each_micro_batch_to_one_rank_longest_first():
    from chatgym.trainer.distributed.data_parallel import DataParallel

    # Rows of 10, 9, 3, 2, 8 tokens; micro-batches [0], [1, 2], [3], [4] hold 10, 12, 2, 8 tokens.
    mini = _Mini([10, 9, 3, 2, 8])
    mbs = [([0], 0), ([1, 2], 0), ([3], 0), ([4], 0)]
    # Longest first to the least-loaded rank: 12 -> r0, 10 -> r1, 8 -> r1 (10 < 12), 2 -> r0 (12 < 18).
    r0 = DataParallel(0, 2).assign(mini, mbs)
    r1 = DataParallel(1, 2).assign(mini, mbs)
    assert r0 == [([1, 2], 0, True), ([3], 0, True)]
    assert r1 == [([0], 0, True), ([4], 0, True)]
    # Three ranks: 12 -> r0, 10 -> r1, 8 -> r2, 2 -> r2 (8 < 10, 12); FSDP lockstep pads r0 and r1 with
    # one inactive pass of the smallest micro-batch ([3]) each, to the two passes r2 runs.
    assert DataParallel(0, 3, sharded=True).assign(mini, mbs) == [([1, 2], 0, True), ([3], 0, False)]
    assert DataParallel(1, 3, sharded=True).assign(mini, mbs) == [([0], 0, True), ([3], 0, False)]
    assert DataParallel(2, 3, sharded=True).assign(mini, mbs) == [([3], 0, True), ([4], 0, True)]
    assert DataParallel(2, 3).assign(mini, mbs) == [([3], 0, True), ([4], 0, True)]


# ---- on a real cluster --------------------------------------------------------------------------

# The learner actors and the local reference compute with this many torch threads: set in the
# driver's environment before the cluster starts, so Ray's workers inherit it and the local Learner's
# cpu_threads() reads it. Left to themselves the reference used every core and the actors 1 thread,
# and the same update then differed by more than 2e-6 on an AMX Xeon (see train_helpers.torch_threads).
THREADS = 1


@pytest.fixture(scope="module", autouse=True)
def same_threads():
    with torch_threads(THREADS):
        yield


@pytest.fixture(scope="module")
def cluster():
    from chatgym.trainer.distributed.cluster import start_or_join

    c = start_or_join(None, num_cpus=4)
    seen = set(c.pids())
    yield c
    seen |= c.pids()
    c.shutdown()
    time.sleep(0.5)
    left = [p for p in seen if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert left == [], f"Ray processes left: {left}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Step 1 of the tiny run, locally: its trajectories and the weights before and after the update."""
    from chatgym.trainer.train import Trainer

    out = tmp_path_factory.mktemp("local")
    trainer = Trainer(tiny_config(out))
    try:
        before = {n: p.detach().clone() for n, p in trainer.learner.policy.named_parameters()}
        trajs = trainer.collect(0)
        metrics = trainer.learner.train_on(trajs)
        after = {n: p.detach().clone() for n, p in trainer.learner.policy.named_parameters()}
        assert torch.get_num_threads() == THREADS  # the learner kept the actors' thread count
    finally:
        trainer.close()
    return trajs, before, after, metrics


def _assert_same_update(got, before, after):
    assert set(got) == set(after)
    moved = max(float((after[n] - before[n]).abs().max()) for n in after)
    assert moved > 1e-4  # the update moved the weights (lr 1e-3): a match below is not trivial
    for name, want in after.items():
        # One thread count on both sides (same_threads) and one machine: what is left is the order
        # of float32 sums over the two ranks' gradients, a few ulps of the update (0 measured on an
        # AVX-512 BF16 EPYC: each rank holds one micro-batch of each mini-batch, and a + b = b + a).
        torch.testing.assert_close(got[name], want, rtol=0, atol=2e-6, msg=name)


@pytest.fixture(scope="module")
def replicate_group(cluster, tmp_path_factory):
    from chatgym.trainer.distributed.learner import RayLearnerGroup

    out = tmp_path_factory.mktemp("ray2")
    cfg = tiny_config(out, "trainer.backend=ray", "trainer.ray.num_learners=2")
    group = RayLearnerGroup(cfg, out_dir=out)
    yield group, out
    group.close()


def test_two_gloo_learners_update_as_one(reference, replicate_group):
    trajs, before, after, metrics = reference
    group, _ = replicate_group
    assert group.info["sharding"] == "replicate"
    assert group.info["torch_threads"] == THREADS  # as the reference's
    start = group.state_dict()
    for name, w in before.items():
        assert torch.equal(start[name], w), name  # same seed -> same random init in the actor
    got_metrics = group.train_on(trajs)
    assert group.version == 1
    _assert_same_update(group.state_dict(), before, after)
    # Global metrics: token-weighted over both ranks' micro-batches = the one-learner values; the
    # batch's (advantage means, trained tokens) come from the whole batch on every rank.
    _assert_same_metrics(got_metrics, metrics)
    # The mismatch's mean is token-weighted over both ranks, its max the larger rank's (reduce_metrics' maxima).
    for key in ("rollout/mismatch/mean_abs", "rollout/mismatch/max_abs", "rollout/mismatch/k3_kl"):
        assert got_metrics[key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-7), key
    assert got_metrics["actor/optimizer_steps"] == metrics["actor/optimizer_steps"] == 4
    # Preparation ran once per row across the ranks: the reference pass and the old-logprob pass
    # (2 epochs x 2 mini-batches) over the 8 rows are 16 row-passes in all, not 16 per rank.
    assert len(trajs) == 8
    per_rank = [m["learner/prepared_rows"] for m in group.rank_metrics]
    assert sum(per_rank) == 2 * len(trajs) and all(0 < n < 2 * len(trajs) for n in per_rank), per_rank
    assert got_metrics["learner/prepared_rows"] == 16.0
    assert got_metrics["learner/prepared_rows_max"] == max(per_rank)


def _assert_same_metrics(got, want):
    """Every metric of the one-learner update (not wall times and rates), within float rounding."""
    keys = [k for k in want if not k.startswith(("timing/", "throughput/"))]
    assert {"actor/kl", "actor/pg_loss", "batch/advantage_mean", "batch/trained_tokens"} <= set(keys)
    for key in keys:
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key


@pytest.fixture(scope="module")
def one_learner(cluster, tmp_path_factory):
    """One learner actor (``trainer.backend: ray``, one learner), shared by the two tests that each
    built one: first ``test_one_ray_learner_updates_as_the_local_one`` (it needs the weights untrained
    and checks them), then the checkpoint test (it ends the group)."""
    from chatgym.trainer.distributed.learner import RayLearnerGroup

    out = tmp_path_factory.mktemp("ray1")
    group = RayLearnerGroup(tiny_config(out, "trainer.backend=ray"), out_dir=out)
    yield group
    group.close()


def test_one_ray_learner_updates_as_the_local_one(reference, one_learner):
    """One learner actor builds its learner with the local trainer's own function (seed, then the
    compute set-up): the same initial weights, the same update and the same metrics."""
    trajs, before, after, metrics = reference
    group = one_learner
    assert group.info["sharding"] == "none" and group.info["torch_threads"] == THREADS
    start = group.state_dict()
    assert all(torch.equal(start[n], w) for n, w in before.items())
    got_metrics = group.train_on(trajs)
    _assert_same_update(group.state_dict(), before, after)
    _assert_same_metrics(got_metrics, metrics)
    assert "learner/prepared_rows" not in got_metrics  # one learner: nothing is split


@pytest.mark.slow  # two more learner processes (~70 s on a loaded 2-core box)
def test_two_fsdp_learners_update_as_one(reference, cluster, tmp_path):
    from chatgym.trainer.distributed.learner import RayLearnerGroup

    trajs, before, after, metrics = reference
    cfg = tiny_config(
        tmp_path, "trainer.backend=ray", "trainer.ray.num_learners=2", "trainer.ray.learner_sharding=fsdp"
    )
    group = RayLearnerGroup(cfg, out_dir=tmp_path)
    try:
        assert group.info["sharding"] == "fsdp" and group.info["torch_threads"] == THREADS
        got_metrics = group.train_on(trajs)
        _assert_same_update(group.state_dict(), before, after)
        assert got_metrics["actor/grad_norm"] == pytest.approx(metrics["actor/grad_norm"], rel=1e-5)
        # Lockstep passes (an FSDP rank with fewer micro-batches) are not counted: 16 rows in all.
        assert got_metrics["learner/prepared_rows"] == 16.0
        # The checkpoint is in the one-learner format: a local Learner restores it.
        ckpt = group.save(tmp_path, 1, {})
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        assert state["step"] == 1 and sorted(state["optimizer"]["policy"]["state"]) == list(range(len(after)))
    finally:
        group.close()


def test_ray_step_metrics_carry_the_router_counters(cluster, tmp_path):
    """A Trainer step on Ray (one learner, two scripted rollout workers): each group's 4 samples ran
    on one worker, and the step's metrics hold every worker's counters, equal to the counts taken
    from the step's trajectories (groups, episodes, generate calls, tokens)."""
    import chatgym.testing  # noqa: F401  (registers the env; the workers import it with their engine)
    from chatgym.trainer.train import Trainer

    cfg = tiny_config(
        tmp_path,
        "env.id=SleepTool-v0",
        "rollout.max_model_len=1024",  # its prompt holds a tool schema
        "rollout.max_tokens=64",
        "rollout.max_response_tokens=128",
        "trainer.backend=ray",
        "trainer.ray.num_rollout_workers=2",
        "trainer.ray.worker_num_cpus=0.5",
        "trainer.ray.engine_factory=chatgym.testing:scripted_engine",
    )
    trainer = Trainer(cfg)
    try:
        result = trainer.loop.run_until_complete(trainer.pipeline.sync_step(0))  # what step(0) runs
        metrics = trainer.step_metrics(result)
    finally:
        trainer.close()
    trajs = result.trajectories
    assert len(trajs) == 8 and all(t.error is None and t.num_turns == 2 for t in trajs)
    workers = {g: {t.info["rollout_worker"] for t in trajs if t.group_id == g} for g in (0, 1)}
    assert workers == {0: {0}, 1: {1}}  # a group per worker, never split
    for w in (0, 1):
        mine = [t for t in trajs if t.info["rollout_worker"] == w]
        assert metrics[f"rollout/worker{w}/groups"] == 1.0
        assert metrics[f"rollout/worker{w}/episodes"] == 4.0
        assert metrics[f"rollout/worker{w}/requests"] == sum(t.num_turns for t in mine) == 8
        assert metrics[f"rollout/worker{w}/gen_tokens"] == sum(t.response_tokens for t in mine)
        assert metrics[f"rollout/worker{w}/tokens"] == sum(len(t.token_ids) for t in mine)
        assert metrics[f"rollout/worker{w}/busy_s"] > 0 and metrics[f"rollout/worker{w}/retried"] == 0
    assert (metrics["rollout/pending_max"], metrics["rollout/workers_down"]) == (0.0, 0.0)


def test_weights_go_to_the_object_store_once_from_rank_0(replicate_group):
    group, _ = replicate_group
    handle = group.export_weights(torch.bfloat16)
    assert isinstance(handle.object_ref, ray.ObjectRef)
    got = dict(handle)
    want = group.state_dict()
    assert set(got) == set(want)
    for name, w in want.items():
        assert got[name].dtype == torch.bfloat16 and torch.equal(got[name], w.to(torch.bfloat16)), name


def test_base_model_saves_the_engine_model_from_rank_0(replicate_group, tmp_path):
    """What ``Trainer`` asks of ``learner.base_model()`` for a random-init engine model: the
    generation config and ``save_pretrained`` (written by learner rank 0, read back here)."""
    from safetensors.torch import load_file

    group, _ = replicate_group
    base = group.base_model()
    assert base.generation_config is not None and base.generation_config.eos_token_id is not None
    base.save_pretrained(tmp_path / "init_model", state_dict={}, safe_serialization=True)
    saved = load_file(tmp_path / "init_model" / "model.safetensors")
    want = group.state_dict()
    # The tied output matrix is stored once, under the embedding's name.
    assert set(saved) == set(want)
    for name, w in want.items():
        assert torch.equal(saved[name], w), name


def test_collective_weight_sync_broadcasts_from_rank_0(replicate_group, tmp_path):
    """``weight_sync: collective`` on CPU: learner rank 0 broadcasts one flat bf16 buffer over a gloo
    group of itself and two rollout workers (the NCCL path on GPUs is the same code with ``nccl``)."""
    from chatgym.trainer.distributed.ray_rollout import RayRollout
    from chatgym.trainer.distributed.weights import CollectiveWeights, checksum
    from chatgym.trainer.models.packaged import load_model_path

    group, _ = replicate_group
    cfg = tiny_config(
        tmp_path,
        "trainer.backend=ray",
        "trainer.ray.num_rollout_workers=2",
        "trainer.ray.worker_num_cpus=0.5",
        "trainer.ray.engine_factory=chatgym.testing:scripted_engine",
        "trainer.ray.weight_sync=collective",
    )
    rollout = RayRollout(cfg, model_path=str(load_model_path("smollm2")), out_dir=str(tmp_path))
    try:
        group.weight_sync = cfg.trainer.ray.weight_sync  # this group was built with the CPU default
        group.collective.verify = True  # the workers return a checksum of what they loaded
        handle = group.export_weights(torch.bfloat16)
        assert isinstance(handle, CollectiveWeights)
        rollout.set_weights(handle, 7)
        want = {n: t.to(torch.bfloat16) for n, t in group.state_dict().items()}
        stats = group.collective.stats
        assert sorted(stats) == [0, 1]  # both workers over the broadcast (no GPU: no CUDA IPC)
        for s in stats.values():
            assert s["checksum"] == checksum(want.items())
            assert s["bytes"] == 2 * sum(t.numel() for t in want.values())
        infos = ray.get([w.info.remote() for w in rollout.workers])
        assert [i["weight_version"] for i in infos] == [7, 7]
        # A second sync reuses the group (same worker processes) and carries the new version.
        rollout.set_weights(group.export_weights(torch.bfloat16), 8)
        assert [i["weight_version"] for i in ray.get([w.info.remote() for w in rollout.workers])] == [8, 8]
        # Regression (the main job on a memory-starved box: Ray's OOM killer took a worker just
        # before the sync, and set_weights raised ActorUnavailableError): a worker that dies during
        # an object-store sync is left to restart and gets these weights and version when back.
        group.weight_sync = "object_store"
        old_pid = rollout.infos[1]["pid"]
        os.kill(old_pid, signal.SIGKILL)
        rollout.set_weights(group.export_weights(torch.bfloat16), 9)
        assert rollout.wait_for_workers(timeout_s=120)
        infos = ray.get([w.info.remote() for w in rollout.workers])
        assert [i["weight_version"] for i in infos] == [9, 9]
        assert infos[1]["pid"] != old_pid  # a new incarnation, loaded on its return
    finally:
        group.weight_sync = "object_store"
        rollout.close()


@contextlib.contextmanager
def file_size_limit_in(actor, limit: int):
    """train_helpers.file_size_limit in ``actor``'s process (RLIMIT_FSIZE is per process: the
    driver's would not reach the actor's writes): files capped at ``limit`` bytes, SIGXFSZ ignored so a
    write past it fails with EFBIG; the old limit restored after (SIGXFSZ stays ignored)."""

    def set_limit(_actor, soft):  # nested: cloudpickle sends it by value (the actor can't import this module)
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        old, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        return old

    old = ray.get(actor.__ray_call__.remote(set_limit, limit))
    try:
        yield
    finally:
        with contextlib.suppress(ray.exceptions.RayActorError):  # a learner the group ended has none to lift
            ray.get(actor.__ray_call__.remote(set_limit, old))


def test_a_checkpoint_the_disk_refuses_in_a_ray_learner_is_one_line_and_keeps_the_older_one(one_learner, tmp_path):
    """Regression: a Ray learner's refused checkpoint write reached the driver as Ray's
    RayTaskError(CheckpointNotWritten), whose text is the actor's traceback: `chatgym train` printed
    that after its one line. A real refused write: a 1 MB file size limit in the learner's process
    against the ~12 MB weights. Now the group raises a local run's one-line CheckpointNotWritten
    (train_cli prints it and returns 1); other errors keep their type."""
    from chatgym.trainer.learner.checkpoint import CheckpointNotWritten, list_checkpoints

    group = one_learner
    ckpts = tmp_path / "checkpoints"
    try:
        first = group.save(tmp_path, 1, {})
        with file_size_limit_in(group.actors[0], 1_000_000), pytest.raises(CheckpointNotWritten) as info:
            group.save(tmp_path, 2, {})
        assert type(info.value) is CheckpointNotWritten  # not Ray's dual RayTaskError(CheckpointNotWritten)
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"could not write checkpoint {ckpts / 'step_000002'}: File too large (")
        assert message.endswith(" GB free on that disk; kept: step_000001)")
        assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001"]  # no partial files
        # The learner lives on, as a local one does: once the disk takes it, the checkpoint is written.
        assert group.save(tmp_path, 2, {}) == ckpts / "step_000002"
        assert list_checkpoints(tmp_path) == [first, ckpts / "step_000002"]
        # Any other error in the learner (here a bad step) is raised as itself and ends the learners.
        with pytest.raises(ValueError, match="Unknown format code 'd'") as info:
            group.save(tmp_path, "three", {})
        assert not isinstance(info.value, CheckpointNotWritten) and group.actors == []
    finally:
        group.close()


def test_a_killed_learner_stops_the_run_naming_the_last_checkpoint(reference, replicate_group):
    from chatgym.trainer.distributed.learner import LearnerFailed

    trajs = reference[0]
    group, out = replicate_group
    ckpt = group.save(out, 1, {"note": "test"})
    assert ckpt == out / "checkpoints" / "step_000001"
    pids = list(group.pids)
    os.kill(pids[1], signal.SIGKILL)  # between steps
    psutil.Process(pids[1]).wait(timeout=10) if psutil.pid_exists(pids[1]) else None
    t0 = time.perf_counter()
    with pytest.raises(LearnerFailed) as info:
        group.train_on(trajs)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("learner rank 1 died (")
    assert message.endswith(f"resume from {ckpt} (--resume)")
    assert time.perf_counter() - t0 < 60  # rank 0 did not wait out its collective's timeout
    deadline = time.time() + 20
    while psutil.pid_exists(pids[0]) and time.time() < deadline:
        if psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.2)
    assert not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
def test_ray_backend_step1_matches_local(cluster, tmp_path):
    """The main job's step 1 (``tests/step1_golden.py``'s ``math_grpo`` case: real SmolLM2-135M, hf
    engine, 2 prompts x 4 samples of <= 32 tokens) with ``trainer.backend: ray`` (one rollout worker,
    one learner) and locally: the same trajectories, the same batch (token ids, loss mask, advantages)
    and the same weights after the update."""
    import dataclasses

    from chatgym.trainer.learner.prepare import prepare_batch
    from chatgym.trainer.models.packaged import load_model_path
    from chatgym.trainer.train import Trainer

    pytest.importorskip("reasoning_gym")
    try:
        load_model_path("smollm2")
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))
    from step1_golden import case_config

    local_cfg = case_config("math_grpo", tmp_path / "local")
    ray_cfg = dataclasses.replace(
        local_cfg,
        train=dataclasses.replace(local_cfg.train, output_dir=str(tmp_path / "ray")),
        trainer=dataclasses.replace(
            local_cfg.trainer,
            backend="ray",
            ray=dataclasses.replace(local_cfg.trainer.ray, learner_num_cpus=0.5, worker_num_cpus=0.5),
        ),
    )
    local = Trainer(local_cfg)
    try:
        trajs_l = local.collect(0)
        want = local.learner

        batch_l, _ = prepare_batch(
            trajs_l,
            local_cfg.algo,
            max_response_tokens=local_cfg.rollout.max_response_tokens,
            pad_id=want.pad_id,
            policy=want.policy,
            plan=want.plan,
        )
        local.learner.train_on(trajs_l)
        after_l = {n: p.detach().clone() for n, p in local.learner.policy.named_parameters()}
    finally:
        local.close()
    remote = Trainer(ray_cfg)
    try:
        assert remote.learner.info["torch_threads"] == THREADS  # as the local run's
        trajs_r = remote.collect(0)
        assert [t.token_ids for t in trajs_r] == [t.token_ids for t in trajs_l]
        assert [t.reward for t in trajs_r] == [t.reward for t in trajs_l]
        assert all(set(v for v in t.weight_versions if v >= 0) == {0} for t in trajs_r)
        batch_r = ray.get(remote.learner.actors[0].batch_of.remote(trajs_r))
        assert torch.equal(batch_r["input_ids"], batch_l.input_ids)
        assert torch.equal(batch_r["loss_mask"], batch_l.loss_mask)
        assert float(batch_l.advantages.abs().max()) > 0.1  # mixed rewards: the weights move
        torch.testing.assert_close(batch_r["advantages"], batch_l.advantages, rtol=0, atol=2e-6)
        remote.learner.train_on(trajs_r)
        assert remote.learner.version == 1
        got = remote.learner.state_dict()
        for name, w in after_l.items():
            torch.testing.assert_close(got[name], w, rtol=0, atol=2e-6, msg=name)
        # The new weights reach the worker from the object store, with their version.
        remote.sync_weights()
        assert [i["weight_version"] for i in ray.get([w.info.remote() for w in remote.rollout.workers])] == [1]
    finally:
        remote.close()


# ---- GPU paths (run on a machine with 2 CUDA GPUs; skipped elsewhere) ------------------------------


# A skipif mark, evaluated before the module's fixtures (cluster, reference run) are set up.
two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
)


@pytest.mark.gpu
@two_gpus
def test_gpu_two_fsdp_nccl_learners_update_as_one(reference, cluster, tmp_path):
    """2 learners on 2 GPUs (NCCL, FSDP2) vs one learner on one GPU, on the tiny run's batch; the
    sharded checkpoint is written in the one-learner format."""
    from chatgym.trainer.chat.tokenizer import get_tokenizer
    from chatgym.trainer.distributed.learner import RayLearnerGroup
    from chatgym.trainer.learner.learner import Learner
    from chatgym.trainer.models.packaged import load_model_path
    from chatgym.trainer.train import seed_everything

    trajs = reference[0]
    local_cfg = tiny_config(tmp_path / "one", "model.device=cuda")
    seed_everything(local_cfg.train.seed)
    one = Learner(local_cfg, get_tokenizer(load_model_path(local_cfg.model.path)))
    before = {n: p.detach().cpu().clone() for n, p in one.policy.named_parameters()}
    want_metrics = one.train_on(trajs)
    after = {n: p.detach().cpu().clone() for n, p in one.policy.named_parameters()}
    del one
    torch.cuda.empty_cache()
    cfg = tiny_config(
        tmp_path / "two",
        "model.device=cuda",
        "trainer.backend=ray",
        "trainer.ray.num_learners=2",
        "trainer.ray.learner_num_gpus=1",
        "trainer.ray.learner_sharding=fsdp",
    )
    group = RayLearnerGroup(cfg, out_dir=tmp_path / "two")
    try:
        assert group.info["sharding"] == "fsdp" and group.weight_sync == "collective"
        got_metrics = group.train_on(trajs)
        got = group.state_dict()
        moved = max(float((after[n] - before[n]).abs().max()) for n in after)
        assert moved > 1e-4
        for name, w in after.items():
            # cuBLAS sums in another order on two GPUs: a tolerance of float32 kernels, not ulps.
            torch.testing.assert_close(got[name], w, rtol=0, atol=2e-5, msg=name)
        assert got_metrics["actor/grad_norm"] == pytest.approx(want_metrics["actor/grad_norm"], rel=1e-4)
        ckpt = group.save(tmp_path / "two", 1, {})
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        assert sorted(state["optimizer"]["policy"]["state"]) == list(range(len(after)))
    finally:
        group.close()


@pytest.mark.gpu
@two_gpus
def test_gpu_weight_sync_nccl_to_another_gpu_and_cuda_ipc_on_the_same(cluster, tmp_path):
    """Colocated placement on 2 GPUs, 1 learner and 2 rollout workers: worker 0 shares learner rank
    0's GPU (bundle 0) and maps its buffer by CUDA IPC; worker 1 is on the other GPU and receives a
    NCCL broadcast. Both load the same values with the version."""
    from chatgym.trainer.distributed.learner import RayLearnerGroup
    from chatgym.trainer.distributed.placement import placement_options
    from chatgym.trainer.distributed.ray_rollout import RayRollout
    from chatgym.trainer.distributed.weights import checksum
    from chatgym.trainer.models.packaged import load_model_path

    cfg = tiny_config(
        tmp_path,
        "model.device=cuda",
        "trainer.backend=ray",
        "trainer.ray.num_rollout_workers=2",
        "trainer.ray.placement=colocated",
        "trainer.ray.learner_num_gpus=0.5",
        "trainer.ray.worker_num_gpus=0.5",
        "trainer.ray.worker_num_cpus=0.5",
        "trainer.ray.engine_factory=chatgym.testing:scripted_engine",
    )
    place = placement_options(cfg)
    group = RayLearnerGroup(cfg, out_dir=tmp_path, scheduling=place.learners)
    rollout = RayRollout(
        cfg, model_path=str(load_model_path("smollm2")), out_dir=str(tmp_path), worker_options=place.workers
    )
    try:
        group.collective.verify = True
        rollout.set_weights(group.export_weights(torch.bfloat16), 3)
        assert group.collective.ipc == {0}
        want = checksum((n, t.to(torch.bfloat16)) for n, t in group.state_dict().items())
        stats = group.collective.stats
        assert sorted(stats) == [0, 1] and all(s["checksum"] == want for s in stats.values())
        infos = ray.get([w.info.remote() for w in rollout.workers])
        assert [i["weight_version"] for i in infos] == [3, 3]
    finally:
        rollout.close()
        group.close()
        ray.util.remove_placement_group(place.group)
