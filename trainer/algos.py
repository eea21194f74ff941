"""Old import path of :mod:`chatgym.trainer.learner.algos` (``from chatgym.trainer.algos import ...``
keeps working for user code that registers its own estimator or loss)."""

from .learner.algos import *  # noqa: F403
from .learner.algos import __all__  # noqa: F401
