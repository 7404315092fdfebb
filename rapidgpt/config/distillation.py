"""Knowledge distillation: Megatron-LM's ModelOpt distillation flags, built here without ModelOpt.

    --export-kd-teacher-load DIR          the teacher: a RapidGPT checkpoint or a Hugging Face folder
                                          (turns distillation on, as in Megatron)
    --export-kd-teacher-model-config F    YAML of the teacher's model flags (Megatron's; default
                                          DIR/model_config.yaml when it exists), over those DIR records
    --export-kd-cfg F                     YAML of the distillation settings (ModelOpt's DistillationConfig):
        logit_layers: [output_layer, output_layer]          the logits' KL divergence (the only pair)
        intermediate_layer_pairs: [[student layer, teacher layer(, cosine|mse)], ...], each layer
                                  decoder.final_layernorm, decoder.layers.N or decoder.layers.N.input_layernorm
        skip_lm_loss: true        train on the distillation loss alone (the logged "lm loss" is then 0)
        kd_loss_scale: 1.0        with skip_lm_loss false: lm loss + scale x (distillation loss
                                  rescaled to the lm loss's size)
        logit_kl_temperature: 1.0

The teacher has the student's tokenizer and vocabulary, its own architecture (what its checkpoint
records), frozen weights and no dropout; it is not saved in the student's checkpoints and is read
again on resume. The loss (rapidgpt/models/distillation.py) is ModelOpt's: per token, the KL
divergence KL(teacher || student) of the softmaxes of the logits / temperature, plus the mean of
the intermediate pairs' losses (cosine: 1 - cos of the two hidden states; mse: their mean squared
difference) rescaled to the logits loss's size (a factor held constant in the backward).
"""
import argparse
import glob
import os
import re
from dataclasses import dataclass

from rapidgpt.config.mla import MLA_FLAGS

LOGIT_LAYERS = ["output_layer", "output_layer"]
# The hidden states an intermediate pair may compare, by Megatron-core's module names: the final norm's
# output, layer N's output, layer N's input norm's output.
INTERMEDIATE_LAYERS = ("decoder.final_layernorm", "decoder.layers.N", "decoder.layers.N.input_layernorm")
_LAYER_NAME = re.compile(r"decoder\.(?:final_layernorm|layers\.(\d+)(\.input_layernorm)?)")


def parse_layer(name):
    """A module name of INTERMEDIATE_LAYERS -> ("final_layernorm", None), ("output", N) or
    ("input_layernorm", N); None for another name."""
    match = _LAYER_NAME.fullmatch(str(name))
    if match is None:
        return None
    if match.group(1) is None:
        return "final_layernorm", None
    return ("input_layernorm" if match.group(2) else "output"), int(match.group(1))
INTERMEDIATE_LOSSES = ("cosine", "mse")
KD_CFG_KEYS = ("intermediate_layer_pairs", "logit_layers", "skip_lm_loss", "kd_loss_scale", "logit_kl_temperature")
TEACHER_CONFIG = "model_config.yaml"


@dataclass(frozen=True)
class DistillationConfig:
    teacher_load: str
    teacher_flags: dict                   # the teacher's model flags that differ from the student's
    intermediate_pairs: tuple = ()        # ((student layer, teacher layer, "cosine" | "mse"), ...)
    skip_lm_loss: bool = True
    kd_loss_scale: float = 1.0
    logit_kl_temperature: float = 1.0

    def teacher_args(self, args):
        """The flags the teacher model is built from: the run's, with the teacher's own model flags."""
        return argparse.Namespace(**{**vars(args), **self.teacher_flags})

    def describe(self):
        pairs = ", ".join(f"{s} ({loss})" for s, _, loss in self.intermediate_pairs) or "none"
        how = ("the distillation loss alone (lm loss logged as 0 in training)" if self.skip_lm_loss else
               f"lm loss + {self.kd_loss_scale:g} x the distillation loss rescaled to the lm loss")
        differs = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in sorted(self.teacher_flags.items())) or "none"
        return (f" > knowledge distillation from {self.teacher_load}: logits KL at temperature "
                f"{self.logit_kl_temperature:g}, intermediate pairs: {pairs}; trained on {how}; "
                f"the teacher's model flags that differ from the student's: {differs}")


def add_distillation_args(parser):
    g = parser.add_argument_group("knowledge distillation (Megatron-LM's ModelOpt flags, built without ModelOpt)")
    g.add_argument("--export-kd-teacher-load", default=None, metavar="DIR",
                   help="distill from this teacher (a RapidGPT checkpoint or Hugging Face folder)")
    g.add_argument("--export-kd-teacher-model-config", default=None, metavar="YAML",
                   help="the teacher's model flags (default DIR/model_config.yaml if present)")
    g.add_argument("--export-kd-cfg", default=None, metavar="YAML",
                   help="distillation settings (intermediate_layer_pairs, skip_lm_loss, kd_loss_scale, "
                        "logit_kl_temperature); default: logits only, skip_lm_loss")


def _read_yaml(path, flag, check):
    import yaml             # PyYAML: Megatron's distillation and teacher configs are YAML files
    if not os.path.isfile(path):
        check.add(f"{flag}: {path} is not a file")
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        check.add(f"{flag}: {path} is not valid YAML ({str(e).splitlines()[0]})")
        return None
    if data is not None and not isinstance(data, dict):
        check.add(f"{flag}: {path} must hold a mapping of settings, not a {type(data).__name__}")
        return None
    return data or {}


def _distillation_settings(args, check):
    """ModelOpt's DistillationConfig from --export-kd-cfg, checked: a dict of keyword arguments."""
    flag = "--export-kd-cfg"
    cfg = _read_yaml(args.export_kd_cfg, flag, check) if args.export_kd_cfg else {}
    if cfg is None:
        return None
    unknown = sorted(set(cfg) - set(KD_CFG_KEYS))
    check.require(not unknown, f"{flag}: unknown setting(s) {', '.join(unknown)}; the settings are "
                               f"{', '.join(KD_CFG_KEYS)}")
    check.require(list(cfg.get("logit_layers", LOGIT_LAYERS)) == LOGIT_LAYERS,
                  f"{flag}: logit_layers {cfg.get('logit_layers')}: the logits compared are the output "
                  f"layers' ({LOGIT_LAYERS}), the only logits a GPT has")
    pairs = []
    for entry in cfg.get("intermediate_layer_pairs") or []:
        if not isinstance(entry, (list, tuple)) or len(entry) not in (2, 3):
            check.add(f"{flag}: intermediate_layer_pairs entry {entry!r} must be [student layer, teacher layer] "
                      f"or [student layer, teacher layer, cosine|mse]")
            continue
        loss = entry[2] if len(entry) == 3 else "cosine"
        bad = [name for name in entry[:2] if parse_layer(name) is None]
        check.require(not bad, f"{flag}: intermediate layer {bad[0] if bad else ''!r} is not built; an "
                               f"intermediate pair compares {', '.join(INTERMEDIATE_LAYERS)} (N from 0)")
        check.require(loss in INTERMEDIATE_LOSSES, f"{flag}: intermediate loss {loss!r} must be one of "
                                                   f"{', '.join(INTERMEDIATE_LOSSES)}")
        pairs.append((entry[0], entry[1], loss))
    settings = {"intermediate_pairs": tuple(pairs)}
    for key, kind in (("skip_lm_loss", bool), ("kd_loss_scale", float), ("logit_kl_temperature", float)):
        if key in cfg:
            value = cfg[key]
            ok = isinstance(value, bool) if kind is bool else isinstance(value, (int, float)) and value > 0
            check.require(ok, f"{flag}: {key} {value!r} must be " + ("true or false" if kind is bool else
                                                                      "a positive number"))
            settings[key] = kind(value) if ok else None
    return settings


def _teacher_flags(args, check):
    """The teacher's model flags that differ from the run's: those its checkpoint (or Hugging Face
    folder) records, then those of its model-config YAML."""
    from rapidgpt.arguments import checkpoint_model_flags
    from rapidgpt.training.checkpoint_files import ARCHITECTURE_ARGS, CheckpointError
    path, flag = args.export_kd_teacher_load, "--export-kd-teacher-load"
    if not os.path.isdir(path):
        check.add(f"{flag}: {path} is not a directory")
        return None
    try:
        saved, _ = checkpoint_model_flags(path, flag)
    except (CheckpointError, OSError, ValueError) as e:
        megatron = glob.glob(os.path.join(path, "iter_*", "mp_rank_*", "model_optim_rng.pt")) + glob.glob(
            os.path.join(path, "iter_*", "*.distcp"))
        check.add(f"{flag}: {path} is a Megatron-LM checkpoint; convert it first (python data_tools/convert_megatron.py "
                  f"--load {path} --save OUT) and give OUT" if megatron else
                  str(e) if str(e).startswith(flag) else f"{flag}: {e}")
        return None
    flags = {name: value for name, value in saved.items() if name in ARCHITECTURE_ARGS}
    config = args.export_kd_teacher_model_config
    if config is None and os.path.isfile(os.path.join(path, TEACHER_CONFIG)):
        config = os.path.join(path, TEACHER_CONFIG)
    if config is not None:
        given = _read_yaml(config, "--export-kd-teacher-model-config", check) or {}
        flags.update({key.replace("-", "_"): value for key, value in given.items()
                      if key.replace("-", "_") in ARCHITECTURE_ARGS})
    return {name: value for name, value in flags.items() if getattr(args, name, None) != value}


def check_distillation_args(args, check):
    """args.distillation: a DistillationConfig with --export-kd-teacher-load, else None."""
    args.distillation = None
    if args.export_kd_teacher_load is None:
        for name in ("export_kd_cfg", "export_kd_teacher_model_config"):
            check.require(getattr(args, name) is None, f"--{name.replace('_', '-')}: a distillation setting; "
                                                       f"add --export-kd-teacher-load (the teacher), or drop it")
        return
    flag = "--export-kd-teacher-load"
    refusals = [(args.model_type == "bert", "distillation is built for the GPT (Megatron's pretrain_gpt.py)"),
                (args.task not in (None, "pretraining"), f"distillation trains a GPT with --task pretraining "
                                                         f"(or a user script), not --task {args.task}"),
                (args.pipeline_model_parallel_size > 1, "distillation with pipeline stages is not built (the "
                                                        "teacher's hidden states would travel beside the "
                                                        "student's); use tensor and data parallelism")]
    for refused, reason in refusals:
        check.require(not refused, f"{flag}: {reason}")
    settings = _distillation_settings(args, check)
    teacher_flags = _teacher_flags(args, check)
    if settings is None or teacher_flags is None:
        return
    for name in ("tokenizer_type", "vocab_size", "model_type"):
        check.require(teacher_flags.get(name) is None or getattr(args, name, None) is None,
                      f"{flag}: the teacher has --{name.replace('_', '-')} {teacher_flags.get(name)}, the student "
                      f"{getattr(args, name, None)}; the logits are compared over one vocabulary, so they "
                      f"must agree")
    unbuilt = [name for name in teacher_flags if name == "use_mup" or name.startswith("mup_") or name in MLA_FLAGS]
    check.require(not unbuilt, f"{flag}: the teacher's muP or multi-latent attention flags differ from the "
                               f"student's ({', '.join(unbuilt)}); such a teacher is not built")
    for student, teacher, _ in settings["intermediate_pairs"]:
        for name, who, layers in ((student, "student", args.num_layers),
                                  (teacher, "teacher", teacher_flags.get("num_layers", args.num_layers))):
            _, n = parse_layer(name) or (None, None)
            check.require(n is None or n < layers, f"--export-kd-cfg: {name}: the {who} has {layers} layers "
                                                   f"(numbered from 0)")
    hidden = teacher_flags.get("hidden_size", args.hidden_size)
    check.require(not settings["intermediate_pairs"] or hidden == args.hidden_size,
                  f"--export-kd-cfg: intermediate_layer_pairs compare hidden states, and the teacher's hidden "
                  f"size {hidden} is not the student's {args.hidden_size} (ModelOpt's learned projection between "
                  f"them is not built); drop the pairs or distill from a teacher of the same width")
    args.distillation = DistillationConfig(args.export_kd_teacher_load, teacher_flags, **{
        k: v for k, v in settings.items() if v is not None})
