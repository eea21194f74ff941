"""A run's outputs: metrics.jsonl (+ TensorBoard, wandb), the per-step rollout metrics and the learning curve."""
