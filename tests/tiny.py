"""Tiny random Llama models and a small real tokenizer, built inside the test process (no downloads)."""

from __future__ import annotations

from pathlib import Path

# ChatML, as SmolLM2 / Qwen use it, with {% generation %} markers so assistant-only masks work.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "what is the capital of france? paris is the capital of france.",
    "instruction input output prompt completion text user assistant system",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z 0 1 2 3 4 5 6 7 8 9",
    "hello world, how are you today? i am fine, thank you.",
]


def make_tokenizer(save_dir: str | Path | None = None):
    """A byte-level BPE tokenizer trained on a few sentences, with ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    if save_dir is not None:
        fast.save_pretrained(str(save_dir))
    return fast


def tiny_llama_config(vocab_size: int = 320, **overrides):
    from transformers import LlamaConfig

    values = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    values.update(overrides)
    return LlamaConfig(**values)


def make_tiny_model_dir(path: str | Path, seed: int = 0, **config_overrides) -> Path:
    """Save a tiny random Llama (safetensors) with the test tokenizer into `path`."""
    import torch
    from transformers import LlamaForCausalLM

    path = Path(path)
    tokenizer = make_tokenizer(path)
    torch.manual_seed(seed)
    config = tiny_llama_config(vocab_size=len(tokenizer), **config_overrides)
    config.bos_token_id = tokenizer.bos_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(path), safe_serialization=True)
    return path
