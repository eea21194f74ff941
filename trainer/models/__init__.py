"""Models offline: the packaged SmolLM2 (``packaged``), dtype choice (``dtype``), random init
(``random_init``) and the CUDA switches the engine and learner share (``cuda``)."""
