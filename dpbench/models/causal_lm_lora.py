"""Causal language models with LoRA adapters (peft) for table-to-text generation (E2E, DART).

``pretrained``: a hub id or folder (Qwen, Llama, GPT-2; GPU presets), or ``tiny-random``: a
2-layer Llama with hidden size 32, randomly initialised from a config and sized to the
offline MiniLM tokenizer's vocabulary, so tests exercise the generation path offline.
"""

from __future__ import annotations

import torch
from torch import nn

from dpbench.errors import ConfigError
from dpbench.models import register_model
from dpbench.utils.pretrained import TINY_RANDOM_LM, from_pretrained, load_tokenizer, peft_model


class CausalLM(nn.Module):
    """Return next-token logits from (input_ids, attention_mask); ``generate`` decodes."""

    def __init__(self, net: nn.Module, pad_token_id: int, eos_token_id: int) -> None:
        super().__init__()
        self.net = net
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids=input_ids, attention_mask=attention_mask).logits

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 max_new_tokens: int) -> torch.Tensor:
        """Return greedy continuations (transformers' ``generate``), prompt tokens removed."""
        out = self.net.generate(input_ids=input_ids, attention_mask=attention_mask,
                                max_new_tokens=max_new_tokens, do_sample=False,
                                pad_token_id=self.pad_token_id, eos_token_id=self.eos_token_id)
        return out[:, input_ids.shape[1]:]


def _tiny_random_lm(vocab_size: int, pad_token_id: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=256, pad_token_id=pad_token_id)
    return LlamaForCausalLM(config)


@register_model("causal_lm_lora")
def causal_lm_lora(input_shape, num_classes: int = 0, pretrained: str = TINY_RANDOM_LM,
                   r: int = 8, alpha: float = 16.0, dropout: float = 0.0,
                   target_modules: list[str] | tuple[str, ...] = ("q_proj", "v_proj")) -> nn.Module:
    """Return the causal LM with LoRA on ``target_modules`` (everything else frozen)."""
    if not isinstance(r, int) or r < 1:
        raise ConfigError(f"model.r must be an integer >= 1 (got {r!r})")
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(pretrained)
    if pretrained == TINY_RANDOM_LM:
        net = _tiny_random_lm(len(tokenizer), tokenizer.pad_token_id)
    else:
        net = from_pretrained(AutoModelForCausalLM, pretrained)
    config = LoraConfig(task_type="CAUSAL_LM", r=r, lora_alpha=alpha, lora_dropout=dropout,
                        target_modules=list(target_modules))
    try:
        net = peft_model(net, config)
    except ValueError as err:
        raise ConfigError(f"model.target_modules {list(target_modules)} do not match "
                          f"{type(net).__name__}: {err}") from err
    return CausalLM(net, tokenizer.pad_token_id, tokenizer.eos_token_id)
