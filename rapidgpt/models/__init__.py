"""Built-in models."""
from rapidgpt.models.gpt import GPTModel, build_gpt_model, lm_loss_func

__all__ = ["GPTModel", "build_gpt_model", "lm_loss_func"]
