"""SPRINT performance model: sweeps -> profile -> prediction, tuning, simulation (SPEC section 4)."""
from .profile import Profile
from .model import Prediction, predict, format_prediction

__all__ = ["Profile", "Prediction", "predict", "format_prediction"]
