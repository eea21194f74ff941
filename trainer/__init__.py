"""Training and evaluation, in two sides and a loop (see ``docs/architecture.md``):

- :mod:`.engines` — inference engines behind one contract;
- :mod:`.rollout` — the rollout side: envs + an engine -> token-exact trajectories (collector, its
  config, episode runner, chat delta, tokenizer, traces, ``chatgym rollout``);
- :mod:`.learner` — the learner side: trajectories -> token batch -> optimizer step (algorithms,
  batch preparation, forward passes, reference policy, update, model loading, checkpoints);
- :mod:`.config`, :mod:`.train`, :mod:`.train_cli` — the run config and the training loop, the only
  place that holds both sides; :mod:`.eval` — ``chatgym eval`` and the leaderboard;
- :mod:`.models` — model files shared by all (packaged SmolLM2, local directories, random init).
"""
