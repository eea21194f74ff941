"""The old import path of the algorithms: ``from chatgym.trainer.algos import ...`` keeps working
for user code that registers its own estimator or loss (they live in ``chatgym.trainer.learner.algos``)."""

from .learner.algos import *  # noqa: F403
from .learner.algos import __all__  # noqa: F401
