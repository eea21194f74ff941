"""UserSim-v0: tau2-bench airline / retail customer service with a simulated user (see ``env``)."""

from chatgym.envs.usersim.env import GREETING, STOP, USER_STOP_SIGNALS, UserSimEnv, replay, scripted_user

__all__ = ["GREETING", "STOP", "USER_STOP_SIGNALS", "UserSimEnv", "replay", "scripted_user"]
