"""The learner side: trajectories -> a token batch -> an optimizer step on the policy.

Holds the token batch
(:mod:`.batch`), batch preparation (:mod:`.prepare`: reward shaping, informative-group filtering,
reward placement, truncation mask, reference/old logprobs, values, advantages — one function), the
forward passes (:mod:`.forward`, :mod:`.logprobs`), the reference policy (:mod:`.reference`), the
update (:mod:`.update`: loss and optimizer step only), model loading (:mod:`.policy`), the optimizer
and schedule (:mod:`.optim`) and checkpoints (:mod:`.checkpoint`).

May import: ``chatgym.trainer.config.run`` (the run config), ``chatgym.trainer.algos`` (the algorithms: pure tensor functions registered by name),
``chatgym.trainer.models`` (model files),
and from the rollout side only the data types it consumes (``chatgym.trainer.rollout.types``,
``chatgym.trainer.rollout.config``). Never the collector, the engines or the envs: a learner
process needs trajectories, not the machinery that made them.
"""
