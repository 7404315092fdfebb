"""`rapidgpt --task sft`: instruction finetuning of the built-in GPT (GPT-2 style or the Llama
family) on .jsonl conversations -- `--task pretraining --sft` (rapidgpt/config/sft.py):

    rapidgpt --task sft --pretrained-model-name-or-path ./Qwen2.5-0.5B-Instruct \
        --data-path chats.jsonl --split 98,2,0 --seq-length 2048 --micro-batch-size 1 \
        --global-batch-size 32 --train-iters 500 --lr 1e-5 --save sft_out/

The conversations are read straight from the .jsonl files (no preprocessing step; the encoding is
cached for the next run), rendered with the model's own chat template, packed, and trained with
the loss on the assistant answers only; validation reports the loss on answers. Without --data-path
it trains on the embedded demo conversations (rapidgpt/data/demo_chats.py).
"""
from rapidgpt.tasks import pretraining

before_launch = pretraining.before_launch


def main(argv=None, args=None):
    """Run the task on `argv` (default: the command line), or on the already parsed `args`."""
    return pretraining.main(argv, args)
