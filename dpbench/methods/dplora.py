"""DP-LoRA (Yu et al. 2022, "Differentially Private Fine-tuning of Language Models", Alg. 1).

DP-SGD/DP-Adam on the trainable parameters of a LoRA-adapted transformer (peft freezes the
rest; the model config chooses the adapters). Every stage is the base class's default; the
optimiser comes from ``conf/method/dplora.yaml``. The baseline of ``spectral_denoise``.
"""

from dpbench.methods import register_method
from dpbench.methods.base import DPMethod

#: the DP release of the LoRA gradients followed by the YAML's optimiser (Adam by default)
DPLORA = register_method(DPMethod(
    "dplora", tasks=frozenset({"text_classification", "text_generation"})))
