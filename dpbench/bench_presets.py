"""What ``dpbench-bench`` times: its models with their input shapes and batch sizes, the
method comparisons and the grad-sample modes (plain data, shared by ``dpbench.bench``'s
command line and ``dpbench.bench_steps``' timed steps)."""

from __future__ import annotations

from dpbench.utils.conf import GRAD_SAMPLE_MODES

#: model -> (input shape, batch size on CPU, batch size on CUDA); text models' shape is the
#: sequence length
DEFAULT_MODELS = {"mlp": ((1, 8, 8), 256, 1024), "cnn2": ((1, 28, 28), 256, 1024),
                  "resnet18": ((3, 32, 32), 64, 256)}
#: text models: (builder settings, as the SST-2 presets use them); not in the default set
#: (the packaged MiniLM is a large download for a first ``make bench``)
TEXT_MODELS = {"minilm_lora": {"layers": [4, 5]}}
#: image models outside the default set: (registry name, builder settings, input shape, CPU
#: batch, CUDA batch). ``vit_small`` is the ``fiber_cifar100_vit`` preset's model (timm's
#: ViT-small, random init) at a CPU resolution: CIFAR's 32 x 32 upsampled to 64 x 64, 16
#: patches of 16 x 16 plus the class token
EXTRA_MODELS = {"vit_small": ("pretrained", {"arch": "vit_small", "weights": False,
                                             "resolution": 64}, (3, 32, 32), 32, 256)}
#: method comparisons: (model, input shape, CPU batch, CUDA batch, methods): one step of each
#: method on a preset's model and batch, against the first method's bk step. ``fiber_cpu`` is
#: ``fiber_cifar10_cpu``: the 2-layer CNN on 3 x 32 x 32 images, B 256; DiSK and FIBER take
#: two evaluation points. ``bandmf_cpu`` is ``fiber_mnist_cpu``: the 2-layer CNN on MNIST's
#: 1 x 28 x 28, B 256; BandMF (its default b) against plain DP-SGD
METHOD_MODELS = {"fiber_cpu": ("cnn2", (3, 32, 32), 256, 1024, ("dpadamw", "disk", "fiber")),
                 "bandmf_cpu": ("cnn2", (1, 28, 28), 256, 1024, ("dpsgd", "bandmf"))}
CACHED = "dpbench bk + prefix cache"
DPBENCH_MODES = tuple(m for m in GRAD_SAMPLE_MODES if m != "auto")
OPACUS_MODES = ("hooks", "ghost")
