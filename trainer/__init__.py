"""Training and evaluation: the loop and its CLI at the root, the rooms below (``docs/architecture.md``).

- :mod:`.train` (``Trainer``), :mod:`.train_cli` (``chatgym train``), :mod:`.pipeline` (the step
  drivers and the weight-sync rule), :mod:`.replay_buffer`, :mod:`.sampler` — the loop, the only place
  that holds both sides;
- :mod:`.chat` — tokenizers, chat templates and token-exact deltas (below engines and rollout);
- :mod:`.engines` — inference engines behind one contract;
- :mod:`.rollout` — the rollout side: envs + an engine -> token-exact trajectories;
- :mod:`.algos` — advantages, losses, KL, entropy, aggregation: pure tensor functions;
- :mod:`.learner` — the learner side: trajectories -> token batch -> optimizer step;
- :mod:`.config` — the run config (one dataclass per YAML section, one loader);
- :mod:`.models` — model files and dtypes shared by all (packaged SmolLM2, random init, CUDA switches);
- :mod:`.roles` (local / Ray builders), :mod:`.logging` (metrics, curves), :mod:`.rewards` (GenRM),
  :mod:`.cotrain` (``chatgym cotrain``), :mod:`.distributed` (Ray), :mod:`.eval` (``chatgym eval``,
  the leaderboard).
"""
