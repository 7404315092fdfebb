# user_scripts/minimal_pretrainer.py: a complete Pretrainer (user_scripts/pretrain_gpt.py also reads every data flag)
from functools import partial

from rapidgpt import Pretrainer, RapidGPTEngine, get_tokenizer, next_batch
from rapidgpt.data.dataset_builder import build_train_valid_test_datasets
from rapidgpt.data.gpt_dataset import GPTDatasetConfig
from rapidgpt.models import build_gpt_model, lm_loss_func


class MyPretrainer(Pretrainer):
    def train_valid_test_datasets_provider(self, train_val_test_num_samples):
        # Megatron's GPT samples of --data-path (.bin/.idx), cut by --split. Any map-style dataset
        # works: len(ds), and ds[i] a dict of numpy arrays [seq_length]: "tokens" int32, "labels"
        # int32 (the tokens shifted by one), "loss_mask" float32, "position_ids" int32.
        args = self.args
        config = GPTDatasetConfig(seq_length=args.seq_length, seed=args.seed, eod=get_tokenizer().eod)
        train_ds, valid_ds, test_ds = build_train_valid_test_datasets(
            config, train_val_test_num_samples, data_path=args.data_path, split=args.split)
        return train_ds, valid_ds, test_ds

    def model_optimizer_lr_scheduler_provider(self, pre_process=True, post_process=True, vp_stage=None):
        vocab_size = get_tokenizer().vocab_size
        return build_gpt_model(self.args, vocab_size, pre_process, post_process, vp_stage), None, None  # None: flags

    def run_forward_step(self, data_iterator, model):
        batch = next_batch(data_iterator)           # Megatron: next(data_iterator); Tensors [micro batch, seq]
        output = model(batch["tokens"], batch["position_ids"], None, batch["labels"])   # per-token loss
        return output, partial(lm_loss_func, batch["loss_mask"])
    # run_compute_metrics(self, model, eval_data_iterator): default = lm loss + PPL


if __name__ == "__main__":
    MyPretrainer(engine=RapidGPTEngine()).train()
