"""Built-in models."""
from rapidgpt.models.distillation import build_distillation_model, distillation_loss
from rapidgpt.models.gpt import GPTModel, build_gpt_model, lm_loss_func

__all__ = ["GPTModel", "build_gpt_model", "lm_loss_func", "build_distillation_model", "distillation_loss"]
