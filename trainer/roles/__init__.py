"""Building a run's two roles from its config: the rollout source and the learner, locally or on Ray."""
